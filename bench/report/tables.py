"""Tables from records: one row per cell, written as Markdown and CSV (pandas).

Only records go in, so a table can be rebuilt from any ``records.jsonl`` at any time. Failed
cells stay in the table with their status; they are never dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from bench.records import Record, first_line

MIB = 2**20


def _mib(nbytes: int | None) -> float | None:
    return None if nbytes is None else nbytes / MIB


def records_to_frame(records: Sequence[Record]) -> pd.DataFrame:
    """Flatten records into one row per cell (memory in MiB, time in ms)."""
    rows = []
    for r in records:
        bd = r.mem_breakdown_bytes or {}
        model_state = sum(bd.get(k, 0) for k in ("params", "grads", "optimizer")) if bd else None
        predicted = (r.predicted_mem_bytes or {}).get("total")
        t = r.step_time_s or {}
        rows.append(
            {
                "workload": r.workload,
                "preset": r.preset,
                "params_M": r.params / 1e6,
                "strategy": r.strategy,
                "world_size": r.world_size,
                "simulated": r.simulated,
                "precision": r.precision,
                "batch_per_rank": r.batch_size_per_rank,
                "status": r.status,
                "step_ms": t.get("median", float("nan")) * 1e3 if t else None,
                "step_mad_ms": t.get("mad", float("nan")) * 1e3 if t else None,
                "samples_per_s": r.samples_per_s,
                "peak_MiB": _mib((r.peak_mem_bytes or {}).get("max")),
                "params_MiB": _mib(bd.get("params")),
                "grads_MiB": _mib(bd.get("grads")),
                "optim_MiB": _mib(bd.get("optimizer")),
                "activ_MiB": _mib(bd.get("activations")),
                "other_MiB": _mib(bd.get("other")),
                "pred_model_state_MiB": _mib(predicted),
                "model_state_vs_pred": (model_state / predicted) if model_state and predicted else None,
                "note": first_line(r.error) if r.status != "ok" else r.note,
            }
        )
    return pd.DataFrame(rows)


def _cell(value: object) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value).replace("|", "\\|")


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub-style Markdown table (own formatter: the GPU image may lack ``tabulate``)."""
    if frame.empty:
        return "(no records)\n"
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows]) + "\n"


def write_tables(records: Sequence[Record], out_dir: Path) -> str:
    """Write ``table.md`` and ``table.csv`` into ``out_dir``; return the Markdown."""
    frame = records_to_frame(records)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = to_markdown(frame)
    (out_dir / "table.md").write_text(md)
    frame.to_csv(out_dir / "table.csv", index=False)
    return md
