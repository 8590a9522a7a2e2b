"""A model's bare passes kept across cells: every cell of one model at one placement times the
same forward and backward before its strategy wraps it (``bare_compute``), whatever the strategy.

One cell's figure is the median of a few passes taken in a fraction of a second: a stall in them,
or the few percent a machine drifts between cells, would show as a difference between two
strategies that is neither's. So each cell's timed passes are kept under
``<home>/peaks/bare.json``, keyed by what makes two passes the same (``bare_key``: the machine,
torch, the model and its batch, precision, world size, threads and placement), and the compute
the step-time model takes is the median over every pass of the newest ``KEPT`` cells of that key,
the cell's own included (``BareCompute.pooled_seconds``). The newest only, so that the figure
follows a machine that changed.

Passes, not cells' medians: a cell of one timed step times one pass, and with more ranks than
cores one pass can read half again the others. As one cell's figure among a few that single pass
would weigh as much as another cell's median of ten; as one pass among the pool's tens it moves
the median by one place. Imports no torch."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from shardbench.paths import atomic_write_text, file_lock, results_home
from shardbench.records import UNNAMED_DEVICE, Record, placement_of

#: the newest figures of one key the pooled median is taken over: enough that one stalled cell
#: does not move it, few enough to follow the machine
KEPT = 9


def pool_path(home: Path | None = None) -> Path:
    return results_home(home) / "peaks" / "bare.json"


def bare_key(record: Record) -> str:
    """What makes two cells' bare passes the same measurement."""
    env = record.env or {}
    placed = placement_of(record)
    flops = record.flops_per_step.hardware if record.flops_per_step else None
    threads = record.bare_compute.threads if record.bare_compute else None
    return " | ".join(
        str(part)
        for part in (
            env.get("device_name") or UNNAMED_DEVICE,
            f"torch {env.get('torch') or '?'}",
            record.workload,
            record.preset,
            f"{record.params} params",
            f"{flops} FLOPs",
            f"batch {record.batch_size_per_rank}",
            record.precision,
            "checkpointed" if record.activation_checkpointing else "stored activations",
            f"{record.world_size} ranks",
            f"{threads} threads",
            f"{placed.get('ranks')} ranks on {placed.get('cores')} cores",
        )
    )


def _read(path: Path) -> dict[str, list[dict[str, Any]]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    return {k: v for k, v in (entries or {}).items() if isinstance(v, list)}


def _passes(entry: Any) -> list[float]:
    """An entry's timed passes; an entry holding only ``seconds`` (a cell's median) counts as
    one pass."""
    if not isinstance(entry, dict):
        return []
    passes = entry.get("passes")
    if isinstance(passes, list):
        return [float(t) for t in passes if isinstance(t, int | float) and t > 0]
    seconds = entry.get("seconds")
    return [float(seconds)] if isinstance(seconds, int | float) and seconds > 0 else []


def pooled(record: Record, home: Path | None = None) -> tuple[float, int, int] | None:
    """Keep the record's bare passes under its key; the median over the passes of the newest
    ``KEPT`` cells of that key, this one included, how many cells and how many passes. None where
    the record timed no bare pass."""
    bare = record.bare_compute
    if bare is None or not bare.seconds:
        return None
    own = [t for t in bare.pass_seconds or [] if t > 0] or [bare.seconds]
    path = pool_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = bare_key(record)
    with file_lock(path):
        entries = _read(path)
        mine = [*entries.get(key, []), {"passes": own, "at": time.strftime("%Y-%m-%dT%H:%M:%S")}]
        mine = [e for e in mine if _passes(e)][-KEPT:]
        entries[key] = mine
        atomic_write_text(path, json.dumps({"entries": entries}, indent=1) + "\n")
    passes = [t for e in mine for t in _passes(e)]
    return statistics.median(passes), len(mine), len(passes)
