"""The nightly history: one small line per cell per night in ``results/history/<suite>.jsonl``.

Only what the trend charts draw is kept (the compared metrics with their baseline and the band
the gate used, the verdicts, whether the runner was dedicated: what decides if absolute step time
was gated), so a year of nights stays a small file that can be committed or cached by CI; the
full records stay in each night's run directory.

Schema 2 lines hold every metric ``compare`` compared for the cell, ``step_time_vs_ddp`` and
``comm_sent_bytes`` included, and ``dedicated``. A schema 1 line may come from a shardbench that
gated other metrics, with other bands (``studies.trend`` reads it by today's gate).
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Any

from shardbench.paths import atomic_write_text, file_lock, split_partial_line
from shardbench.studies.compare import CellDelta, Comparison
from shardbench.wording import count

SCHEMA = 2


def history_lines(
    comparison: Comparison, *, suite: str, run_id: str, name: str, baseline: str, git_sha: str | None
) -> list[dict[str, Any]]:
    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return [
        {
            "schema": SCHEMA,
            "suite": suite,
            "run_id": run_id,
            "name": name,
            "time": now,
            "git_sha": git_sha,
            "baseline": baseline,
            "cell": c.cell,
            "status": c.current_status or "missing",
            "verdict": c.verdict,
            #: a rule ignores this cell's regression (the gate passed it): the reason, or ""
            "ignored": c.ignored,
            #: the rules declared the runner dedicated: absolute step time was gated too
            "dedicated": comparison.dedicated,
            "metrics": _metrics(c),
        }
        for c in comparison.cells
    ]


def _metrics(c: CellDelta) -> dict[str, dict[str, Any]]:
    return {
        m.metric: {
            "value": m.current,
            "baseline": m.baseline,
            "low": m.low,
            "high": m.high,
            "verdict": m.verdict,
            "unit": m.unit,
        }
        for m in c.metrics
    }


def append_history(path: Path, lines: list[dict[str, Any]]) -> None:
    """Add a night's lines to the history: under a lock (two nights never interleave), the whole
    file rewritten at once (a failure leaves it as it was), and a partial last line (the remains
    of an interrupted write) set aside in ``<file>.corrupt`` rather than glued to the night's
    first line."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"history {path} is a directory; give a .jsonl file")
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(line, sort_keys=True, allow_nan=False) + "\n" for line in lines)
    with file_lock(path):
        old = path.read_text() if path.exists() else ""
        kept, partial = split_partial_line(old)
        if partial:
            with open(f"{path}.corrupt", "a") as bad:
                bad.write(partial + "\n")
            moved = f"moved a partial last line ({count(len(partial), 'byte')}) to {path}.corrupt"
            warnings.warn(f"{path}: {moved}", stacklevel=2)
        atomic_write_text(path, kept + text)
