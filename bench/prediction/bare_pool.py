"""A model's bare passes kept across cells: every cell of one model at one placement times the
same forward and backward before its strategy wraps it (``bare_compute``), whatever the strategy.

One cell's figure is the median of a few passes taken in a fraction of a second: a stall in them,
or the few percent a machine drifts between cells, would show as a difference between two
strategies that is neither's. So each cell's figure is kept under ``<home>/peaks/bare.json``,
keyed by what makes two passes the same (``bare_key``: the machine, torch, the model and its
batch, precision, world size, threads and placement), and the compute the step-time model takes
is the median of the newest ``KEPT`` figures of that key, the cell's own included
(``BareCompute.pooled_seconds``). The newest only, so that the figure follows a machine that
changed. Imports no torch."""

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


def pooled(record: Record, home: Path | None = None) -> tuple[float, int] | None:
    """Keep the record's bare figure under its key; the median of the newest ``KEPT`` of that
    key, this one included, and how many that is. None where the record timed no bare pass."""
    bare = record.bare_compute
    if bare is None or not bare.seconds:
        return None
    path = pool_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = bare_key(record)
    with file_lock(path):
        entries = _read(path)
        mine = [*entries.get(key, []), {"seconds": bare.seconds, "at": time.strftime("%Y-%m-%dT%H:%M:%S")}]
        mine = [e for e in mine if isinstance(e, dict) and isinstance(e.get("seconds"), int | float)][-KEPT:]
        entries[key] = mine
        atomic_write_text(path, json.dumps({"entries": entries}, indent=1) + "\n")
    return statistics.median(e["seconds"] for e in mine), len(mine)
