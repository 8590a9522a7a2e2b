"""Trend charts of a nightly history: one PNG per metric, one small panel per cell.

Small multiples rather than one crowded plot: a suite has tens of cells whose values differ by
orders of magnitude, and what matters is each cell against its own baseline, so every cell gets
its own y axis while all panels share the nights on x (a bad night lines up down the page).

A panel shows the night's value (line and dots), the baseline it was compared with (dashed),
the tolerance band the gate applied (shaded; outside it a night is improved or regressed), red
X marks on nights the metric regressed, and a triangle on the bottom edge for nights with no
value: red and labelled with the status where the cell became failing, grey where it was still
failing or missing, or where the night's line does not hold the metric ("not recorded"). Baseline
and band are drawn as steps centred on each night, so a baseline refresh shows as a step on the
night it happened and a single night still has a visible band. Band and marks are the gate's
only (``studies.trend``: ``Series.gated``): a metric it does not gate (absolute step time on a
shared runner, MFU) is drawn with its values and baseline, and its title says why it has neither.

Drawn on the Agg canvas directly, never through ``pyplot``, like ``bench/report/chart_drawing.py``.
"""

from __future__ import annotations

import math
import statistics
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib import dates as mdates
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from shardbench.report.chart_types import slug
from shardbench.report.trend_html import write_page
from shardbench.studies.trend import Series, display_unit, not_gated_title, read_history, series
from shardbench.wording import count

COLUMNS = 4  # 50 cells make 13 rows: tall, but every panel stays legible at 100 dpi
PANEL_IN = (3.7, 2.3)  # width, height of one cell's panel in inches, gaps included
GAP_IN = (0.55, 0.4)  # between panels: y tick labels; a panel's title (inner panels have no x labels)
LEFT_IN, RIGHT_IN, FOOT_IN = 0.7, 0.2, 0.45  # foot: the dates under the last row
VALUE_COLOR = "#1f77b4"
BAND_COLOR = "#2ca02c"
ALARM_COLOR = "#d62728"
QUIET_COLOR = "#7f7f7f"
FAILED_VERDICT = "now failing"
#: a night whose line does not hold the metric, though its cell ran (an older shardbench's line)
NOT_RECORDED = "not recorded"


def write_trend(
    history_path: Path, out_dir: Path, *, history: Sequence[dict[str, Any]] | None = None
) -> Path:
    """Write one ``trend-<metric>.png`` per metric and ``trend.html`` into ``out_dir``; return the
    page. ``history``: the lines already read from ``history_path`` (the CLI reads them first, to
    refuse an empty file before it creates anything); read here when not given."""
    history_path = Path(history_path)
    if history is None:
        history = read_history(history_path)
    if not history:
        raise ValueError(f"{history_path} holds no valid history line")
    suite = ", ".join(sorted({line["suite"] for line in history}))
    by_metric: dict[str, list[Series]] = {}
    for (_, metric), s in series(history).items():
        by_metric.setdefault(metric, []).append(s)
    out_dir.mkdir(parents=True, exist_ok=True)
    charts = {}
    for metric, items in by_metric.items():
        path = out_dir / f"trend-{slug(metric)}.png"
        draw_metric(metric, items, suite=suite).savefig(path, format="png", dpi=100)
        charts[metric] = path
    return write_page(history, charts, out_dir=out_dir, source=history_path)


def draw_metric(metric: str, items: Sequence[Series], *, suite: str) -> Figure:
    """One figure for ``metric``: a title, a legend and a grid of one panel per cell."""
    n = len(items)
    cols = min(COLUMNS, n)
    rows = math.ceil(n / cols)
    width = cols * PANEL_IN[0]
    label, scale = display_unit(items[0].unit)
    times = [t for s in items for t in s.times]
    judged = any(g for s in items for g in s.gated)
    nights = f"{min(times):%Y-%m-%d} to {max(times):%Y-%m-%d}"
    text = f"{metric} ({label}) per cell, {suite}: {count(n, 'cell')}, {nights}"
    title = textwrap.wrap(
        text if judged else f"{text}; {not_gated_title(metric)}",
        int(width * 9),  # characters of 12 pt bold per inch, so one column's title still fits
    )
    handles = _legend(gated=judged, unrecorded=not all(r for s in items for r in s.recorded))
    legend_cols = min(cols, 3)
    below_title = 0.2 + 0.22 * len(title)
    # legend rows, then room for the first row's panel titles
    head_in = below_title + 0.2 * math.ceil(len(handles) / legend_cols) + 0.4
    height = rows * PANEL_IN[1] + head_in + FOOT_IN
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    # Margins in inches, not a layout engine: constrained layout takes ~10 s on 50 panels.
    axes_w = (width - LEFT_IN - RIGHT_IN - (cols - 1) * GAP_IN[0]) / cols
    axes_h = (height - head_in - FOOT_IN - (rows - 1) * GAP_IN[1]) / rows
    fig.subplots_adjust(
        left=LEFT_IN / width,
        right=1 - RIGHT_IN / width,
        top=1 - head_in / height,
        bottom=FOOT_IN / height,
        wspace=GAP_IN[0] / axes_w,
        hspace=GAP_IN[1] / axes_h,
    )
    fig.text(
        0.1 / width, 1 - 0.1 / height, "\n".join(title), ha="left", va="top", fontsize=12, fontweight="bold"
    )
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.1 / width, 1 - below_title / height),
               ncols=legend_cols, fontsize=8, frameon=False)  # fmt: skip
    # Not sharex: sharing makes every autoscale walk all siblings (quadratic in panels); the same
    # limits and tick rule on every panel line the nights up just as well.
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    edges = [_edges([mdates.date2num(t) for t in s.times]) for s in items]
    xlim = (min(e[0][0] for e in edges), max(e[1][-1] for e in edges))
    for i, (ax, s) in enumerate(zip(axes, items, strict=False)):
        ax.set_xlim(*xlim)  # before drawing: x is then never autoscaled
        draw_panel(ax, s, scale=scale)
        locator = mdates.AutoDateLocator(minticks=2, maxticks=5)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
        ax.xaxis.get_offset_text().set_fontsize(7)
        ax.tick_params(axis="x", labelbottom=i + cols >= n)  # dates under a column's last panel only
        if i % cols == 0:
            ax.set_ylabel(label, fontsize=8)
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig


def draw_panel(ax: Axes, s: Series, *, scale: float) -> None:
    """One cell: band and baseline as steps around each night, the values, and the marks."""
    x = [mdates.date2num(t) for t in s.times]
    left, right = _edges(x)

    def y(values: Sequence[float | None]) -> list[float]:
        return [math.nan if v is None else v / scale for v in values]

    values, base, low, high = y(s.values), y(s.baselines), y(s.lows), y(s.highs)
    # one polygon, stepping at night edges; fill_between leaves a gap where a night has no band
    ax.fill_between([e for le, r in zip(left, right, strict=True) for e in (le, r)],
                    [v for v in low for _ in (0, 1)], [v for v in high for _ in (0, 1)],
                    color=BAND_COLOR, alpha=0.18, linewidth=0)  # fmt: skip
    # steps-mid switches halfway between nights; the end points carry the step to the edges
    ax.plot([left[0], *x, right[-1]], [base[0], *base, base[-1]], "--", color="black", linewidth=1.0,
            drawstyle="steps-mid")  # fmt: skip
    ax.plot(x, values, "-o", color=VALUE_COLOR, linewidth=1.3, markersize=3.5)
    bad = [(xi, v) for xi, v, verdict in zip(x, values, s.verdicts, strict=True) if verdict == "regressed"]
    if bad:
        ax.plot(*zip(*bad, strict=True), "X", color=ALARM_COLOR, markeredgecolor="darkred", markersize=9,
                zorder=5)  # fmt: skip
    _mark_no_value(ax, s, x)
    last = "regressed" if s.verdicts[-1] == "regressed" else None
    last = FAILED_VERDICT if s.cell_verdicts[-1] == FAILED_VERDICT else last
    title = s.cell if last is None else f"{s.cell}  (last night: {last})"
    # a fixed y: placing titles automatically measures every tick label, half the drawing time
    ax.set_title(title, loc="left", fontsize=7.5, color=ALARM_COLOR if last else "black", y=1.0, pad=3)
    if all(math.isnan(v) for v in values + base + low + high):
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ax.text(0.5, 0.5, "no value on any night", transform=ax.transAxes, ha="center", fontsize=8,
                color=QUIET_COLOR)  # fmt: skip
    else:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=4))
        ax.margins(y=0.25)  # room above and below for the marks, and the failure labels
        fmt = ax.yaxis.get_major_formatter()  # 117.52 MiB, not "+1.175e2" in a corner and 0.02
        fmt.set_useOffset(False)
        fmt.set_scientific(False)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


def _mark_no_value(ax: Axes, s: Series, x: Sequence[float]) -> None:
    """A triangle on the bottom edge for each night without a value; the status is written where
    a failing stretch starts, so 20 failed nights are not 20 overlapping labels."""
    prev = None
    for xi, v, verdict, status, held in zip(
        x, s.values, s.cell_verdicts, s.statuses, s.recorded, strict=True
    ):
        if v is not None:
            prev = None
            continue
        what = status if status not in (None, "ok") else (verdict or "no value") if held else NOT_RECORDED
        color = ALARM_COLOR if verdict == FAILED_VERDICT else QUIET_COLOR
        ax.plot(xi, 0.0, "^", color=color, markersize=7, transform=ax.get_xaxis_transform(), clip_on=False,
                zorder=5)  # fmt: skip
        if what != prev or verdict == FAILED_VERDICT:
            ax.annotate(what, (xi, 0.0), xycoords=ax.get_xaxis_transform(), xytext=(0, 7),
                        textcoords="offset points", rotation=90, ha="center", va="bottom", fontsize=6.5,
                        color=color)  # fmt: skip
        prev = what


def _edges(x: Sequence[float]) -> tuple[list[float], list[float]]:
    """Each night's span: halfway to its neighbours, and half a typical gap past the ends."""
    gaps = [b - a for a, b in zip(x, x[1:], strict=False) if b > a]
    half = statistics.median(gaps) / 2 if gaps else 0.5
    mids = [(a + b) / 2 for a, b in zip(x, x[1:], strict=False)]
    return [x[0] - half, *mids], [*mids, x[-1] + half]


def _legend(*, gated: bool, unrecorded: bool) -> list[Line2D | Patch]:
    """The legend of a chart: the band and the regressed mark only where the gate gated the
    metric on some night (``gated``), the mark of a night that did not record it where one did not."""

    def mark(marker: str, color: str, label: str, **kw: Any) -> Line2D:
        return Line2D([], [], marker=marker, color=color, linestyle="", label=label, **kw)

    gate = [
        Patch(color=BAND_COLOR, alpha=0.18, label="the gate's band (outside: improved / regressed)"),
        mark("X", ALARM_COLOR, "regressed", markeredgecolor="darkred", markersize=9),
    ]
    missing = f"still failing, missing or {NOT_RECORDED}" if unrecorded else "still failing or missing"
    return [
        Line2D([], [], color=VALUE_COLOR, marker="o", markersize=3.5, label="value each night"),
        Line2D([], [], color="black", linestyle="--", label="baseline compared with"),
        *(gate if gated else []),
        mark("^", ALARM_COLOR, "now failing (no value; status shown)", markersize=7),
        mark("^", QUIET_COLOR, f"{missing} (no value)", markersize=7),
    ]
