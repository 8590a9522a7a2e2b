"""Charts from records, written as PNG and SVG: what `chart_data.py` decided, drawn with matplotlib.

Figures are built on the Agg canvas directly (``Figure`` + ``FigureCanvasAgg``), never through
``pyplot``: no global figure registry to leak in a long report run, and no backend switch that
would disturb a notebook importing this module. Each ``plot_*`` function takes records and an
output directory and returns the files it wrote, or ``[]`` when the records hold nothing for it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from shardbench.records import Record
from shardbench.report import chart_data as C
from shardbench.report.chart_types import Bar, Chart, Panel
from shardbench.report.styles import hatch, legend_label, strategy_color
from shardbench.studies.reference import REFERENCE

FORMATS = ("png", "svg")
PART_COLORS = {
    "params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868",
    "activations": "#c44e52", "comm": "#8172b3", "other": "#8c8c8c",
}  # fmt: skip
FAILED_COLOR = "firebrick"
LOG_RANGE = 30  # bars spanning more than this ratio go on a log axis, or the small ones vanish
DPI = 110
#: the smallest text (ticks, legends, notes), in points: 13.75 px at ``DPI``, so still 10 px on
#: a page that shows a chart at 72% of its size, the least the report allows (``html.py``)
SMALL = 9
#: a bar's number, one point smaller: it must fit above a bar among a dozen
BAR_NUMBER = SMALL - 1


def plot_peak_memory(records: Sequence[Record], out_dir: Path) -> list[Path]:
    return save_charts(C.peak_memory_charts(records), out_dir)


def plot_breakdown(records: Sequence[Record], out_dir: Path) -> list[Path]:
    return save_charts(C.breakdown_charts(records), out_dir)


def plot_step_time(records: Sequence[Record], out_dir: Path) -> list[Path]:
    return save_charts(C.step_time_charts(records), out_dir)


def plot_max_size(records: Sequence[Record], out_dir: Path) -> list[Path]:
    return save_charts(C.max_size_charts(records), out_dir)


def plot_memory_scaling(records: Sequence[Record], out_dir: Path) -> list[Path]:
    return save_charts(C.memory_scaling_charts(records), out_dir)


def plot_all(records: Sequence[Record], out_dir: Path) -> dict[str, list[Path]]:
    """Every chart kind (in report order) and the files written for it."""
    return {kind: save_charts(build(records), out_dir) for kind, build in C.ALL_CHARTS.items()}


def save_charts(charts: Sequence[Chart], out_dir: Path) -> list[Path]:
    written: list[Path] = []
    if charts:
        out_dir.mkdir(parents=True, exist_ok=True)
    for chart in charts:
        fig = draw(chart)
        for fmt in FORMATS:
            path = out_dir / f"{chart.name}.{fmt}"
            # No timestamp in the SVG, so an unchanged chart is an unchanged file.
            fig.savefig(
                path,
                format=fmt,
                dpi=DPI,
                bbox_inches="tight",
                metadata={"Date": None} if fmt == "svg" else {},
            )
            written.append(path)
    return written


def _number(value: float) -> str:
    """Bar labels: whole numbers from 100 up (2,943 ms, not 2.94e+03), three significant digits below."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _label_inches(labels: Sequence[str]) -> float:
    """Roughly how wide the widest tick label is at ``SMALL`` points."""
    return 0.2 + 0.085 * max((len(line) for label in labels for line in label.splitlines()), default=0)


def draw(chart: Chart) -> Figure:
    """One figure: bold title and grey subtitle on top, a panel per row, notes at the bottom."""
    n_bars = max(len(p.bars) for p in chart.panels)
    groups = {b.group for p in chart.panels for b in p.bars}
    label_width = len(groups) * _label_inches(list(groups)) if chart.kind != "breakdown" else 0
    width = min(24.0, max(8.0, 3.0 + 0.3 * n_bars, 3.0 + label_width))
    wrap = int(width * 13)
    subtitle = textwrap.wrap(chart.subtitle, wrap)
    notes = [line for note in chart.notes for line in textwrap.wrap(note, wrap)]
    top_in, bottom_in = 0.45 + 0.2 * len(subtitle), 0.1 + 0.19 * len(notes)
    height = 4.2 * len(chart.panels) + top_in + bottom_in
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    for i, panel in enumerate(chart.panels):
        ax = fig.add_subplot(len(chart.panels), 1, i + 1)
        if chart.kind == "breakdown":
            _draw_breakdown(ax, panel)
        elif panel.lines:
            _draw_lines(ax, panel)
        else:
            _draw_bars(ax, panel, fig_width=width)
        if panel.title:
            ax.set_title(panel.title, fontsize=10, loc="left")
    fig.tight_layout(rect=(0, bottom_in / height, 1, 1 - top_in / height), h_pad=2.0)
    fig.text(0.01, 1 - 0.08 / height, chart.title, ha="left", va="top", fontsize=13, fontweight="bold")
    fig.text(0.01, 1 - 0.4 / height, "\n".join(subtitle), ha="left", va="top", fontsize=9, color="dimgray")
    if notes:
        text = "\n".join(notes)
        fig.text(0.01, 0.05 / height, text, ha="left", va="bottom", fontsize=SMALL, color="dimgray")
    return fig


def _failed_bar(ax: Axes, x: float, width: float, height: float, bar: Bar, edge: str) -> None:
    """A failed cell stays in the chart: an empty hatched bar carrying its status."""
    ax.bar(x, height, width, fill=False, hatch="///", edgecolor=edge, linewidth=1.0)
    ax.text(x, height / 2, bar.status, rotation=90, ha="center", va="center", fontsize=SMALL,
            color=FAILED_COLOR, fontweight="bold",
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})  # fmt: skip


def _failed_handle() -> Patch:
    return Patch(fill=False, hatch="///", edgecolor=FAILED_COLOR, label="failed / no data (status shown)")


def _series_order(panel: Panel) -> list[str]:
    """Strategies in the order the records (and so the table) list them: legend, bars and table
    read in one order."""
    return list(dict.fromkeys(b.series for b in panel.bars))


def _draw_bars(ax: Axes, panel: Panel, *, fig_width: float) -> None:
    """Grouped bars: one group per cell, one bar per strategy; DDP's value as a dashed reference."""
    groups = list(dict.fromkeys(b.group for b in panel.bars))
    series = _series_order(panel)
    present = {(b.group, b.series) for b in panel.bars}
    slots = {g: [s for s in series if (g, s) in present] for g in groups}
    width = 0.8 / max(len(s) for s in slots.values())
    values = [b.value for b in panel.bars if b.value is not None and b.value > 0]
    top = max((b.value + (b.err or 0) for b in panel.bars if b.value is not None), default=0.0) or 1.0
    log = bool(values) and max(values) / min(values) > LOG_RANGE
    # a number wider than its bar stands upright, or it runs into its neighbours' (about 2.5 in
    # of the figure are the y label and the legend; a digit is about 0.6 em wide)
    bar_in = (fig_width - 2.5) / len(groups) * width
    widest = max((len(_number(v)) for v in values), default=0) * 0.6 * BAR_NUMBER / 72
    upright = widest > bar_in
    for b in panel.bars:
        slot = slots[b.group]  # centred in its group: only the strategies this cell has
        x = groups.index(b.group) + width * (slot.index(b.series) - (len(slot) - 1) / 2)
        if b.value is None:
            _failed_bar(ax, x, width, top * 0.3, b, strategy_color(b.series))
            continue
        ax.bar(
            x, b.value, width, color=strategy_color(b.series), edgecolor="white", linewidth=0.5,
            hatch=hatch(b.series),
        )  # fmt: skip
        if b.err is not None:
            ax.errorbar(x, b.value, yerr=b.err, color="black", capsize=2, linewidth=0.8)
        ax.text(x, b.value + (b.err or 0), _number(b.value), ha="center", va="bottom", fontsize=BAR_NUMBER,
                rotation=90 if upright else 0)  # fmt: skip
    for group, value in panel.reference.items():
        gx, half = groups.index(group), width * len(slots[group]) / 2 + 0.05
        ax.hlines(value, gx - half, gx + half, colors="black", linestyles="--", linewidth=1.2, zorder=3)
    crowded = len(groups) * _label_inches(groups) > fig_width - 3
    ax.set_xticks(range(len(groups)), groups, fontsize=SMALL, rotation=25 if crowded else 0,
                  ha="right" if crowded else "center")  # fmt: skip
    ax.set_ylabel(panel.ylabel + (" — log scale" if log else ""))
    if log:
        ax.set_yscale("log")
        ax.set_ylim(min(values) / 3, top * 6)
    else:
        ax.set_ylim(0, top * 1.25)
    ax.grid(axis="y", alpha=0.3)
    handles: list[Artist] = [
        Patch(facecolor=strategy_color(s), edgecolor="white", hatch=hatch(s), label=legend_label(s, s))
        for s in series
    ]
    if panel.reference:
        handles.append(
            Line2D([], [], color="black", linestyle="--", label=f"{REFERENCE} (reference)")
        )
    if any(b.value is None for b in panel.bars):
        handles.append(_failed_handle())
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=SMALL, frameon=False)


def _draw_breakdown(ax: Axes, panel: Panel) -> None:
    """Per cell: the stacked breakdown at the peak, the model states held after a step (stacked,
    hatched) and the predicted model states (outline)."""
    xs, x, prev = [], 0.0, None
    for b in panel.bars:
        x += 0.0 if prev is None else (1.0 if b.group == prev else 1.6)  # a gap between groups
        xs.append(x)
        prev = b.group
    w = 0.28
    tops = [b.value or 0 for b in panel.bars] + [b.predicted or 0 for b in panel.bars]
    tops += [sum((b.held_parts or {}).values()) for b in panel.bars]
    top = max(tops) or 1.0
    for x, b in zip(xs, panel.bars, strict=True):
        if b.parts is None:
            _failed_bar(ax, x - w, w, top * 0.3, b, strategy_color(b.series))
        else:
            _stack(ax, x - w, w, b.parts)
        if b.held_parts is not None:
            _stack(ax, x, w, b.held_parts, hatch="////", alpha=0.6)
        if b.predicted is not None:
            ax.bar(x + w, b.predicted, w, fill=False, edgecolor="black", hatch="..", linewidth=1.0)
    ax.set_xticks(xs, [b.series for b in panel.bars], fontsize=SMALL, rotation=90)
    # The cell (preset, N, ...) once per group, under its strategies' names.
    centres: dict[str, list[float]] = {}
    for x, b in zip(xs, panel.bars, strict=True):
        centres.setdefault(b.group, []).append(x)
    groups = ax.secondary_xaxis("bottom")
    groups.set_xticks([sum(v) / len(v) for v in centres.values()], list(centres), fontsize=SMALL)
    groups.tick_params(length=0, pad=8 + 5.9 * max(len(b.series) for b in panel.bars))
    groups.spines["bottom"].set_visible(False)
    ax.set_ylabel(panel.ylabel)
    ax.set_ylim(0, top * 1.1)
    ax.grid(axis="y", alpha=0.3)
    handles: list[Artist] = [Patch(color=c, label=p) for p, c in PART_COLORS.items()]
    if any(b.held_parts is not None for b in panel.bars):
        handles.append(Patch(facecolor="white", hatch="////", edgecolor="gray", label="held after a step"))
    handles.append(Patch(fill=False, hatch="..", edgecolor="black", label="predicted model states"))
    if any(b.parts is None for b in panel.bars):
        handles.append(_failed_handle())
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=SMALL, frameon=False)


def _stack(ax: Axes, x: float, w: float, parts: dict[str, float], **style: object) -> None:
    bottom = 0.0
    for part, value in parts.items():
        ax.bar(x, value, w, bottom=bottom, color=PART_COLORS.get(part, "gray"), linewidth=0, **style)
        bottom += value


def _draw_lines(ax: Axes, panel: Panel) -> None:
    """x = world size on a log2 axis; hollow markers are simulated/fake points, x marks failures."""
    xs = sorted({x for line in panel.lines for x in line.x})
    for line in panel.lines:
        c, style = strategy_color(line.strategy), "--" if line.dashed else "-"
        pts = [(x, y) for x, y in zip(line.x, line.y, strict=True) if y is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), style, color=c, linewidth=1.8 if not line.dashed else 1.2)
        for x, y, hollow in zip(line.x, line.y, line.hollow, strict=True):
            if y is not None:
                marker, size = ("s", 5) if line.dashed else (line.marker, 6)  # a lone point says which it is
                ax.plot(x, y, marker, color=c, markerfacecolor="white" if hollow else c, markersize=size)
        for x, y, up in zip(line.x, line.y, line.upper or [None] * len(line.x), strict=True):
            if up is not None and y is not None:  # the bisection interval: the true limit lies in it
                ax.vlines(x, y, up, colors=c, alpha=0.35, linewidth=3)
        for x, y, status in zip(line.x, line.y, line.status, strict=True):
            if y is None:
                ax.plot(x, 0, "x", color=FAILED_COLOR, markersize=9, markeredgewidth=2, clip_on=False)
                ax.annotate(f"{line.series}: {status}", (x, 0), xytext=(4, 6), textcoords="offset points",
                            rotation=90, fontsize=SMALL, color=FAILED_COLOR)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.minorticks_off()
    ax.set_xlim(xs[0] / 1.5, xs[-1] * 1.5)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    ax.grid(alpha=0.3)
    # a dashed line is named by its style's entry below, not as a series of its own
    labels = list(dict.fromkeys((x.series, x.strategy, x.marker) for x in panel.lines if not x.dashed))
    handles: list[Artist] = [
        Line2D([], [], color=strategy_color(s), marker=m, label=legend_label(label, s))
        for label, s, m in labels
    ]
    if any(line.dashed for line in panel.lines):  # say which style is which only when both appear
        handles.append(Line2D([], [], color="black", linestyle="-", marker="o", label="measured"))
        handles.append(Line2D([], [], color="black", linestyle="--", marker="s", markersize=5,
                              label=panel.dashed_label or f"predicted ({panel.predicted})"))  # fmt: skip
    if any(h for line in panel.lines for h in line.hollow):
        handles.append(Line2D([], [], color="black", marker="o", markerfacecolor="white", linestyle="",
                              label="simulated / fake (planned)"))  # fmt: skip
    if any(y is None for line in panel.lines for y in line.y):
        handles.append(
            Line2D([], [], color=FAILED_COLOR, marker="x", linestyle="", label="failed (status shown)")
        )
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=SMALL, frameon=False)
