"""One self-contained ``index.html``: environment, charts and the table, for a set of records.

The page carries its own CSS and refers to the chart files beside it by relative name, so the
report folder can be copied, zipped or published as it is. Every piece of text that came from a
record is escaped: error messages hold ``<``, ``>`` and ``&`` often enough (tensor reprs, paths).
"""

from __future__ import annotations

import html
import numbers
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from bench.harness.records import Record
from bench.report.tables import format_value

SECTIONS = {
    "peak_memory": (
        "Peak memory per rank",
        "One bar per strategy and cell: the highest rank's peak. The dashed line is DDP's peak in the "
        "same cell, so a bar's distance below it is the saving. Hatched bars are failed cells, with status.",
    ),
    "breakdown": (
        "Memory breakdown against the prediction",
        "Left of each pair: what the peak rank held at its peak, by category. Right (dotted outline): "
        "the analytic ZeRO prediction of model states only, to compare with params + grads + optimizer "
        "and with the diamond (model states held after a step), where records carry it.",
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
p.lead { color: #555; margin-top: 0; } p.how { color: #444; max-width: 60em; }
figure { margin: 1em 0 2em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #666; }
table { border-collapse: collapse; font-size: 0.8em; margin: 0.5em 0 1em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.5em; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; position: sticky; top: 0; } td.text { text-align: left; }
td.note { text-align: left; white-space: normal; min-width: 20em; }
tr.failed td { background: #fdecea; } td.status-fail { color: #a40000; font-weight: bold; }
.scroll { overflow-x: auto; } .empty { color: #777; font-style: italic; }
"""


def write_index(
    records: Sequence[Record], *, frame: pd.DataFrame, charts: Mapping[str, Sequence[Path]], out_dir: Path
) -> Path:
    """Write ``out_dir/index.html``; ``charts`` maps a chart kind to its PNG and SVG files in ``out_dir``."""
    statuses = pd.Series([r.status for r in records]).value_counts().to_dict() if records else {}
    summary = ", ".join(f"{n} {s}" for s, n in statuses.items())
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>shardbench report</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>shardbench report</h1>",
        f'<p class="lead">{len(records)} records ({_e(summary)}) from {len({r.run_id for r in records})} '
        "run(s). Built from records only.</p>",
        "<h2>Environment</h2>",
        _environment(records),
    ]
    for kind, (title, how) in SECTIONS.items():
        parts += [f"<h2>{_e(title)}</h2>", f'<p class="how">{_e(how)}</p>', _figures(charts.get(kind, []))]
    parts += ["<h2>All records</h2>", '<div class="scroll">', _table(frame), "</div>", "</body></html>"]
    path = out_dir / "index.html"
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return path


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _figures(paths: Sequence[Path]) -> str:
    """Each chart as its PNG, linking to the SVG beside it (zoomable, selectable text)."""
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
        out.append(
            f'<figure id="{_e(stem)}"><img src="{_e(img.name)}" alt="{_e(stem)}" loading="lazy">'
            f"<figcaption>{_e(stem)} — {links}</figcaption></figure>"
        )
    return "\n".join(out)


def _environment(records: Sequence[Record]) -> str:
    """One row per run: where, on what, with which versions, and how (simulated? fake?)."""
    header = (
        "run", "tags", "run id", "suite", "cells", "failed", "device", "device name", "precision",
        "simulated", "fake", "activation checkpointing", "torch", "cuda", "python", "host", "git sha", "time",
    )  # fmt: skip
    rows = []
    for run_id in dict.fromkeys(r.run_id for r in records):
        rs = [r for r in records if r.run_id == run_id]
        times = sorted({str(r.env.get("time")) for r in rs if r.env.get("time")})
        tags = {k: v for r in rs for k, v in (r.tags or {}).items()}
        rows.append(
            (
                _join(r.name for r in rs),
                ", ".join(f"{k}={v}" for k, v in sorted(tags.items())),
                run_id,
                _join(r.suite for r in rs),
                len(rs),
                sum(1 for r in rs if r.status != "ok"),
                _join(r.device for r in rs),
                _join(r.env.get("device_name") for r in rs),
                _join(r.precision for r in rs),
                _mixed([r.simulated for r in rs], "simulated", "real"),
                _mixed([r.fake for r in rs], "fake (planned)", "real tensors"),
                _mixed([r.activation_checkpointing for r in rs], "AC", "off"),
                _join(r.env.get("torch") for r in rs),
                _join(r.env.get("cuda") for r in rs),
                _join(r.env.get("python") for r in rs),
                _join(r.env.get("host") for r in rs),
                _join(r.env.get("git_sha") for r in rs),
                times[0] if len(times) == 1 else (f"{times[0]} … {times[-1]}" if times else ""),
            )
        )
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f'<td class="text">{_e(v)}</td>' for v in row) + "</tr>" for row in rows)
    return f'<div class="scroll"><table><tr>{head}</tr>{body}</table></div>'


def _join(values: Iterable[object]) -> str:
    return ", ".join(dict.fromkeys(str(v) for v in values if v not in (None, "")))


def _mixed(flags: Sequence[bool], yes: str, no: str) -> str:
    return yes if all(flags) else no if not any(flags) else f"mixed ({sum(flags)} {yes})"


def _table(frame: pd.DataFrame) -> str:
    """The Markdown table's rows as HTML, failed rows highlighted."""
    if frame.empty:
        return '<p class="empty">(no records)</p>'
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
            cells.append(f"<td{attr}>{_e(format_value(v))}</td>")
        rows.append(('<tr class="failed">' if failed else "<tr>") + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>" + "".join(rows) + "</table>"
