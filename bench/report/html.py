"""One self-contained ``index.html`` for a set of records, the verdict first: a plan's budget and
recommendation (when the run was a plan), the summary table of each strategy against ddp and
each cell's scaling efficiency (where the run measured its N=1 cells), then the environment,
the charts in a grid (two per row at a desktop width) and every record.

The page carries its own CSS and refers to the chart files beside it by relative name, so the
report folder can be copied, zipped or published as it is. Every piece of text that came from a
record is escaped: error messages hold ``<``, ``>`` and ``&`` often enough (tensor reprs, paths).
A section with nothing to show is left out. Nothing on the page is wider than the window: wide
tables scroll in their own box, and a chart is shown at 72% of its size at the least (its
smallest text stays near 10 px), scrolling in its own box below that.
"""

from __future__ import annotations

import html
import numbers
import struct
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from shardbench.records import FAILED_STATUSES, Record, strategy_label
from shardbench.report.plan_html import plan_lead
from shardbench.report.scaling_html import scaling_table
from shardbench.report.summary_html import summary_table
from shardbench.report.tables import format_value
from shardbench.studies.reference import REFERENCE
from shardbench.wording import count

#: the least a chart is scaled down to fit its column: its smallest text (``plots.SMALL``, 9 pt
#: at 110 dpi, 13.75 px) stays near 10 px; below it, the chart scrolls in its own box
MIN_SCALE = 0.72
#: the narrowest column of the chart grid (px): two per row from a window of about 1330 px
COLUMN_PX = 640
#: a chart wider than this (px) takes a whole row: in one column it would shrink below MIN_SCALE
WIDE_PX = COLUMN_PX / MIN_SCALE

SECTIONS = {
    "peak_memory": (
        "Peak memory per rank",
        "One bar per strategy and cell: the highest rank's peak. The dashed line is DDP's peak in the "
        "same cell, so a bar's distance below it is the saving. Hatched bars are failed cells, with status.",
    ),
    "breakdown": (
        "Memory breakdown against the prediction",
        "Per cell, left: what the peak rank held at its peak, by category (comm: buffers a strategy "
        "holds for communication). Middle (hatched): the model states it holds after a step - where "
        "zero2's gradient shards are, which do not exist yet at its forward peak. Right (dotted "
        "outline): the analytic ZeRO prediction of model states, to compare with the middle bar.",
    ),
    "step_time": (
        "Step time and throughput",
        "Median step time of the slowest rank with MAD error bars, and samples per second over all "
        "ranks. Simulated and fake (planned) cells are left out: their step time has no communication.",
    ),
    "memory_scaling": (
        "Memory per rank against world size",
        "Solid lines are measured peaks, dashed lines the predicted model states, one colour per "
        "strategy; hollow markers are simulated (or fake) world sizes, crosses are failed cells.",
    ),
    "comm_scaling": (
        "Communication per rank against world size",
        "Bytes each rank sends in one steady step (every collective counted, a ring's share per "
        "rank), solid, against ZeRO's accounting for the strategy, dashed; hollow markers are "
        "simulated or fake worlds, which issue the same collectives as real ones.",
    ),
    "mfu": (
        "MFU per strategy",
        "Model FLOPs utilisation of one rank per strategy and cell: its model FLOPs per step over the "
        "median step time, against the device's peak (a datasheet's, or this machine's measured GEMM "
        "peak). Real ranks only: a simulated cell's step time has no communication.",
    ),
    "throughput_scaling": (
        "Throughput against world size",
        f"Samples per second over all ranks at each world size, every strategy's line starting at "
        f"{REFERENCE}'s N=1 cell of the same run; the dashed line is ideal scaling, N times that "
        "cell's samples per second. A point's height over the dashed line is its scaling efficiency.",
    ),
    "max_size": (
        "Largest trainable size against world size",
        "From max-size searches: the largest size that trained in the per-rank budget; the pale bar "
        "above a point reaches the smallest size that failed (the search's resolution).",
    ),
}

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1500px;
       padding: 0 1em; color: #222; line-height: 1.4; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
h1, h2, p { overflow-wrap: break-word; }
p.lead { color: #555; margin-top: 0; } p.how { color: #444; max-width: 60em; }
figure { margin: 1em 0 2em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #666; overflow-wrap: anywhere; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(100%, COLUMN_PX), 1fr));
        gap: 1.5em; align-items: start; }
.grid figure { margin: 0; min-width: 0; overflow-x: auto; } .grid figure.wide { grid-column: 1 / -1; }
table { border-collapse: collapse; font-size: 0.8em; margin: 0.5em 0 1em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.5em; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; position: sticky; top: 0; } td.text, th.text { text-align: left; }
td.note { text-align: left; white-space: normal; min-width: 20em; }
tr.failed td { background: #fdecea; } td.status-fail { color: #a40000; font-weight: bold; }
.scroll { overflow: auto; max-width: 100%; } .scroll table { margin: 0; }
.records { max-height: 75vh; border: 1px solid #ddd; } .empty { color: #777; font-style: italic; }
table.summary { font-size: 0.9em; } table.summary tbody.group { border-top: 2px solid #999; }
table.summary tr.reference td { background: #f7f7f7; }
table.summary td.preset { white-space: normal; max-width: 18em; overflow-wrap: break-word; }
span.noise { color: #666; } span.beyond { font-weight: bold; }
table.summary tr.recommended td { background: #e6f4ea; font-weight: bold; }
section.plan p.verdict { font-size: 1.05em; max-width: 70em; }
dl.facts { display: flex; flex-wrap: wrap; gap: 0.5em 2.5em; margin: 0.5em 0; }
dl.facts dt { font-size: 0.8em; color: #666; } dl.facts dd { margin: 0; font-size: 1.4em; font-weight: bold; }
ul.env { font-size: 0.9em; color: #333; padding-left: 1.2em; overflow-wrap: anywhere; }
ul.env code { color: #666; }
""".replace("COLUMN_PX", f"{COLUMN_PX}px")


def write_index(
    records: Sequence[Record],
    *,
    frame: pd.DataFrame,
    charts: Mapping[str, Sequence[Path]],
    out_dir: Path,
    plan: Mapping[str, Any] | None = None,
    charts_note: str | None = None,
) -> Path:
    """Write ``out_dir/index.html``; ``charts`` maps a chart kind to its PNG and SVG files in
    ``out_dir``; ``plan``: a plan run's summary (``plan_html.read_plan``), shown first;
    ``charts_note``: why there are no charts, where they were left out on purpose."""
    statuses = pd.Series([r.status for r in records]).value_counts().to_dict() if records else {}
    summary = ", ".join(f"{n} {s}" for s, n in statuses.items())
    what = "plan" if plan else "report"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>shardbench {what}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>shardbench {what}</h1>",
        f'<p class="lead">{count(len(records), "record")} ({_e(summary)}) from '
        f"{count(len({r.run_id for r in records}), 'run')}. Built from records only.</p>",
    ]
    if plan:
        parts.append(plan_lead(plan))
    if versus := summary_table(records):
        parts += [f"<h2>Each strategy against {_e(REFERENCE)}</h2>", versus]
    if scaled := scaling_table(records):
        parts += ["<h2>Scaling efficiency</h2>", scaled]
    parts += ["<h2>Environment</h2>", _environment(records)]
    if charts_note:
        parts.append(f'<p class="how">{_e(charts_note)}</p>')
    for kind, (title, how) in SECTIONS.items():
        if charts.get(kind):  # a section with nothing to show is left out, not shown empty
            parts += [f"<h2>{_e(title)}</h2>", f'<p class="how">{_e(how)}</p>', _figures(charts[kind])]
    if drill := _drill_down(records):
        parts += ["<h2>Drill-down</h2>", drill]
    if not frame.empty:
        parts += ["<h2>All records</h2>", '<div class="scroll records">', _table(frame), "</div>"]
    parts.append("</body></html>")
    path = out_dir / "index.html"
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return path


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _png_size(path: Path) -> tuple[int, int] | None:
    """A PNG's width and height in pixels, from its header; None for anything else."""
    try:
        with path.open("rb") as f:
            head = f.read(24)
    except OSError:
        return None
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def _figures(paths: Sequence[Path]) -> str:
    """Each chart as its PNG in the grid, linking to the SVG beside it (zoomable, selectable
    text): at its own size where its column allows, never below ``MIN_SCALE`` of it."""
    by_stem: dict[str, dict[str, Path]] = {}
    for p in paths:
        by_stem.setdefault(p.stem, {})[p.suffix.lstrip(".")] = p
    if not by_stem:
        return '<p class="empty">No chart: these records hold nothing for it.</p>'
    out = []
    for stem, files in by_stem.items():
        img = files.get("png") or next(iter(files.values()))
        links = " · ".join(
            f'<a href="{_e(p.name)}">{_e(fmt.upper())}</a>' for fmt, p in sorted(files.items())
        )
        size, wide = "", False
        if dims := _png_size(img):
            width, height = dims
            size = f' width="{width}" height="{height}" style="min-width: {int(width * MIN_SCALE)}px"'
            wide = width > WIDE_PX
        cls = ' class="wide"' if wide else ""
        out.append(
            f'<figure id="{_e(stem)}"{cls}><img src="{_e(img.name)}" alt="{_e(stem)}"{size}>'
            f"<figcaption>{_e(stem)} — {links}</figcaption></figure>"
        )
    return '<div class="grid">' + "\n".join(out) + "</div>"


def _environment(records: Sequence[Record]) -> str:
    """One line per run: its name and id, what ran and failed, where, how (simulated? fake?),
    with which versions, the short git sha and when; no table to scroll sideways."""
    items = []
    for run_id in dict.fromkeys(r.run_id for r in records):
        rs = [r for r in records if r.run_id == run_id]
        times = sorted({str(r.env.get("time")) for r in rs if r.env.get("time")})
        tags = {k: v for r in rs for k, v in (r.tags or {}).items()}
        failed = sum(1 for r in rs if r.status in FAILED_STATUSES)  # a skipped cell did not fail
        device = _join(r.device for r in rs)
        name = _join(r.env.get("device_name") for r in rs)
        facts = [
            count(len(rs), "cell") + (f", {failed} failed" if failed else ""),
            f"{device} ({name})" if name else device,
            _join(r.precision for r in rs),
            _mixed([r.simulated for r in rs], "simulated", "real ranks"),
            _mixed([r.fake for r in rs], "fake (planned)", "real tensors"),
            _mixed([r.activation_checkpointing for r in rs], "AC", ""),
            "torch " + _join(r.env.get("torch") for r in rs),
            "cuda " + _join(r.env.get("cuda") for r in rs) if any(r.env.get("cuda") for r in rs) else "",
            "python " + _join(r.env.get("python") for r in rs),
            _join(r.env.get("host") for r in rs),
            "git " + _join(str(r.env.get("git_sha"))[:7] for r in rs if r.env.get("git_sha")),
            times[0] if len(times) == 1 else (f"{times[0]} … {times[-1]}" if times else ""),
        ]
        title = _join(r.name for r in rs) or _join(r.suite for r in rs)
        tag_text = " [" + ", ".join(f"{k}={v}" for k, v in sorted(tags.items())) + "]" if tags else ""
        items.append(
            f"<li><b>{_e(title)}</b>{_e(tag_text)} <code>{_e(run_id)}</code>: "
            + _e(" · ".join(f for f in facts if f and f not in ("git ", "torch ", "python ")))
            + "</li>"
        )
    return '<ul class="env">' + "".join(items) + "</ul>"


def _drill_down(records: Sequence[Record]) -> str:
    """Links to the artefacts cells wrote (``--memory-snapshot``, ``--trace``), or "" if none."""
    rows = []
    for r in records:
        if not r.artifacts:
            continue
        links = " · ".join(f'<a href="{_e(path)}">{_e(label)}</a>' for label, path in r.artifacts.items())
        cell = f"{r.workload} {r.preset} {strategy_label(r)} N={r.world_size} b={r.batch_size_per_rank}"
        rows.append(f"<li>{_e(cell)}: {links}</li>")
    if not rows:
        return ""
    how = (
        "PyTorch's own artefacts, per cell: a CUDA memory snapshot (open it at "
        "https://pytorch.org/memory_viz), on the CPU the memory tracker's per-module table, and a "
        "Chrome trace of one step (chrome://tracing or https://ui.perfetto.dev; our phases are "
        "labelled shardbench::...)."
    )
    return f'<p class="how">{_e(how)}</p><ul>' + "".join(rows) + "</ul>"


def _join(values: Iterable[object]) -> str:
    return ", ".join(dict.fromkeys(str(v) for v in values if v not in (None, "")))


def _mixed(flags: Sequence[bool], yes: str, no: str) -> str:
    return yes if all(flags) else no if not any(flags) else f"mixed ({sum(flags)} {yes})"


def _table(frame: pd.DataFrame) -> str:
    """The Markdown table's rows as HTML, failed rows highlighted, each linking its traceback."""
    head = "".join(f"<th>{_e(c)}</th>" for c in frame.columns)
    rows = []
    for row in frame.itertuples(index=False):
        values = dict(zip(frame.columns, row, strict=True))
        failed = values.get("status") != "ok"
        cells = []
        for col, v in values.items():
            numeric = isinstance(v, numbers.Number) and not isinstance(v, bool | np.bool_)
            cls = "note" if col == "note" else "" if numeric else "text"
            if col == "status" and failed:
                cls += " status-fail"
            attr = f' class="{cls.strip()}"' if cls.strip() else ""
            text = _e(format_value(v))
            if col == "traceback" and text:  # the failed cell's whole error, beside the report
                text = f'<a href="{text}">{text}</a>'
            cells.append(f"<td{attr}>{text}</td>")
        rows.append(('<tr class="failed">' if failed else "<tr>") + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
