"""The plan's chart of the shard width: each strategy's predicted step and peak against S.

Drawn where a plan planned some strategy at more than one width (a cluster ``--network`` or
``--ranks-per-node``): a line per strategy through its widths, the step on the left, the peak
per rank on the right, S on a log-2 axis (the widths double). On the Agg canvas directly, as
every chart of the report (``chart_drawing.py``).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from shardbench.report.chart_drawing import DPI, FORMATS, SMALL
from shardbench.report.styles import strategy_color

NAME = "shard-widths"
GIB = 1 << 30


def width_series(plan: dict[str, Any]) -> dict[str, list[tuple[int, float, float]]]:
    """Per strategy planned at two or more widths: (S, predicted step in seconds, peak bytes) of
    each width that fitted the run (a row with both figures), S ascending."""
    series: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for row in plan.get("rows", []):
        step = (row.get("predicted_step_time") or {}).get("step")
        if row.get("shard_group") and step and row.get("peak_bytes"):
            series[row["strategy"]].append((row["shard_group"], step, row["peak_bytes"]))
    return {s: sorted(points) for s, points in series.items() if len(points) > 1}


def plot_shard_widths(plan: dict[str, Any], out_dir: Path) -> list[Path]:
    """``shard-widths.png`` and ``.svg`` in ``out_dir``; none where no strategy has two widths."""
    series = width_series(plan)
    if not series:
        return []
    fig = Figure(figsize=(11.0, 4.4))
    FigureCanvasAgg(fig)
    step_ax, peak_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for strategy, points in series.items():
        widths = [p[0] for p in points]
        style = dict(color=strategy_color(strategy), marker="o", label=strategy)
        step_ax.plot(widths, [p[1] * 1e3 for p in points], **style)
        peak_ax.plot(widths, [p[2] / GIB for p in points], **style)
    for ax, label in ((step_ax, "predicted step (ms)"), (peak_ax, "peak per rank (GiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({w for points in series.values() for w, _, _ in points}))
        ax.get_xaxis().set_major_formatter(lambda value, _: f"{value:g}")
        ax.set_xlabel("shard width S (ranks)", fontsize=SMALL)
        ax.set_ylabel(label, fontsize=SMALL)
        ax.tick_params(labelsize=SMALL)
        ax.grid(alpha=0.3)
    step_ax.legend(fontsize=SMALL)
    title = plan.get("title", "").split("; sizes in")[0]  # each axis names its own unit
    fig.suptitle(title, fontsize=10, x=0.01, ha="left", wrap=True)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    written = []
    for fmt in FORMATS:
        path = out_dir / f"{NAME}.{fmt}"
        fig.savefig(path, format=fmt, dpi=DPI, metadata={"Date": None} if fmt == "svg" else {})
        written.append(path)
    return written
