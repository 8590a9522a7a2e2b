"""``trend.html``: the last night's regressions as a table, then the trend chart of each metric.

The question a reader of a nightly trend page brings is "what broke last night?", so the page
answers it first, in a table of exact numbers, and the charts follow for "since when, and is it
noise?". Like ``index.html`` it carries its own CSS and names the PNGs beside it by relative
path, so the folder can be copied or published as it is; text from the history is escaped.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from shardbench.report.html import CSS
from shardbench.studies.trend import (
    EVERY_METRIC_SCHEMA,
    alarms,
    display_unit,
    last_night,
    metric_key,
    night_gated,
    night_of,
    not_gated_title,
    parse_time,
    schema_of,
    unit_of,
    unrecorded,
)
from shardbench.wording import count

HOW = (
    "One panel per cell, oldest night on the left; all panels share the nights. The line is the "
    "night's value, the dashed line the baseline it was compared with and the shaded band the "
    "gate's tolerance: a value outside it is improved or regressed. A red X marks a night the "
    "metric regressed. A metric the gate does not gate (absolute step time on a shared runner, "
    "MFU) has neither, and its chart says so. A triangle on the bottom edge is a night without a "
    "value: red (with the status) where the cell became failing, grey where it was still failing "
    "or missing, or where the night's line does not hold the metric."
)


OLDER = (
    "Nights written by an older shardbench (history schema 1) show the bands its gate applied "
    "then, and no band for absolute step time, which the gate gates on a dedicated runner only "
    "and those lines do not say whether theirs was."
)


def unrecorded_line(history: Sequence[dict[str, Any]]) -> str | None:
    """What the page and the command say of gated metrics no night of ``history`` holds."""
    missing = unrecorded(history)
    if not missing:
        return None
    names = " and ".join([", ".join(missing[:-1]), missing[-1]] if len(missing) > 1 else missing)
    return (
        f"not charted: {names}, which the gate gates; no night of this history records "
        f"{'them' if len(missing) > 1 else 'it'} (its lines come from an older shardbench, which did "
        "not keep them; a night written by nightly now does)"
    )


def write_page(
    history: Sequence[dict[str, Any]], charts: Mapping[str, Path], *, out_dir: Path, source: Path
) -> Path:
    """Write ``out_dir/trend.html`` for ``history``; ``charts`` maps a metric to its PNG in ``out_dir``."""
    suite = ", ".join(sorted({line["suite"] for line in history}))
    times = sorted(parse_time(line["time"]) for line in history)
    nights = len({night_of(line) for line in history})
    cells = len({line["cell"] for line in history})
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>shardbench trend: {_e(suite)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>shardbench trend: {_e(suite)}</h1>",
        f'<p class="lead">{count(nights, "night")} from {times[0]:%Y-%m-%d} to {times[-1]:%Y-%m-%d}, '
        f"{count(cells, 'cell')}, read from {_e(source.name)}.</p>",
        *_last_night(history),
        "<h2>Trends</h2>",
        f'<p class="how">{_e(HOW)}</p>',
    ]
    if line := unrecorded_line(history):
        parts.append(f'<p class="missing" id="unrecorded">{_e(line[0].upper() + line[1:])}.</p>')
    if any(schema_of(line) < EVERY_METRIC_SCHEMA for line in history):
        parts.append(f'<p class="how" id="older">{_e(OLDER)}</p>')
    for metric in sorted(charts, key=metric_key):
        path = charts[metric]
        gated = any(night_gated(line, metric) for line in history)
        caption = f"{metric} — {path.name}" + ("" if gated else f"; {not_gated_title(metric)}")
        parts.append(
            f'<figure id="{_e(path.stem)}"><img src="{_e(path.name)}" alt="{_e(metric)} per cell over time">'
            f"<figcaption>{_e(caption)}</figcaption></figure>"
        )
    parts.append("</body></html>")
    page = out_dir / "trend.html"
    page.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return page


def _last_night(history: Sequence[dict[str, Any]]) -> list[str]:
    """The heading, what the last run was, its verdict counts, and the table of what went wrong."""
    lines = last_night(history)
    first = lines[0]
    counts = Counter(str(line.get("verdict") or "no verdict") for line in lines)
    about = [
        f"{first['time']}",
        count(len(lines), "cell") + ": " + ", ".join(f"{n} {v}" for v, n in counts.items()),
    ]
    if first.get("baseline"):
        about.append(f"baseline {first['baseline']}")
    if first.get("git_sha"):
        about.append(f"git {str(first['git_sha'])[:12]}")
    out = [
        f"<h2>Last night: {_e(first.get('name') or first.get('run_id') or first['time'])}</h2>",
        f'<p class="lead">{_e("; ".join(about))}</p>',
    ]
    found = alarms(lines)
    if not found:
        return [*out, '<p class="empty">No regression and no newly failing cell on the last night.</p>']
    header = ("cell", "status", "verdict", "metric", "value", "baseline", "band", "change")
    rows = [_row(line, metric) for line, metric in found]
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(
        '<tr class="failed">' + "".join(f'<td class="text">{_e(v)}</td>' for v in row) + "</tr>"
        for row in rows
    )
    return [*out, f'<div class="scroll"><table id="regressions"><tr>{head}</tr>{body}</table></div>']


def _row(line: dict[str, Any], metric: str | None) -> tuple[str, ...]:
    cell = (line["cell"], str(line.get("status") or ""), str(line.get("verdict") or ""))
    if metric is None:
        return (*cell, "", "", "", "", "")
    m = line["metrics"][metric]
    label, scale = display_unit(unit_of(metric, m))
    value, base, low, high = (m.get(k) for k in ("value", "baseline", "low", "high"))
    change = f"{value / base - 1:+.1%}" if value is not None and base else ""
    band = f"{_num(low, scale)} – {_num(high, scale, label)}" if low is not None or high is not None else ""
    return (*cell, metric, _num(value, scale, label), _num(base, scale, label), band, change)


def _num(v: float | None, scale: float, label: str = "") -> str:
    if v is None or not math.isfinite(v):
        return "—"
    x = v / scale
    text = f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"
    return f"{text} {label}".strip()


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)
