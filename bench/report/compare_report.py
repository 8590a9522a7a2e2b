"""A comparison as files: ``compare.md`` (for a CI job summary), ``compare.json`` (for tools)
and ``compare.html`` (for people), regressions first and highlighted; and the short text the
command prints. Everything here renders a ``Comparison``; nothing decides a verdict."""

from __future__ import annotations

import html
import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from shardbench.report.html import CSS
from shardbench.report.provenance_text import commit_text, provenance_lines
from shardbench.report.tables import markdown_table
from shardbench.studies.compare import COMM_METRIC, NOT_JUDGED, VERDICTS, CellDelta, Comparison, MetricDelta
from shardbench.studies.compare_strategy import POWER
from shardbench.studies.reference import REFERENCE
from shardbench.wording import count

COLUMNS = ("verdict", "cell", "metric", "baseline", "current", "change", "band", "note")


def metric_value(m: MetricDelta, value: float | None) -> str:
    if value is None:
        return "-"
    if m.metric == COMM_METRIC:  # gated to the byte: show the bytes
        return f"{value / 2**20:,.2f} MiB ({value:,.0f} B)"
    if m.unit == "bytes":
        return f"{value / 2**20:,.2f} MiB"
    if m.unit == "params":
        return f"{value / 1e6:,.1f}M params"
    if m.unit == "samples":
        return f"{value:,.0f} per rank"
    if m.unit == "x":
        return f"{value:.3f}x"
    if m.unit == "fraction":
        return f"{value * 100:.3g}%"
    return f"{value * 1e3:.3f} ms"


def _change(m: MetricDelta) -> str:
    pct = m.change_pct
    if pct is None:
        return "-"
    if m.unit == "bytes" and m.current is not None and m.baseline is not None:
        return f"{pct:+.2f}% ({(m.current - m.baseline) / 2**20:+,.2f} MiB)"
    return f"{pct:+.1f}%"


def _band(m: MetricDelta) -> str:
    if m.low is None or m.high is None:
        return "-"
    return f"{metric_value(m, m.low)} .. {metric_value(m, m.high)}"


def rows(comparison: Comparison, *, only_regressions: bool = False) -> list[tuple[str, ...]]:
    """One row per metric of each cell, saying the metric's own verdict (the cell's is the worst
    of them); one row with the cell's verdict for a cell without metrics (failing, new, missing).
    The rows that fail the gate come first: a regressed cell's unchanged metrics follow the
    regressions of every cell, not stand before them."""
    out, failing = [], []
    for c in comparison.cells:
        if only_regressions and not c.regressed:
            continue
        ignored = f" (ignored: {c.ignored})" if c.ignored else ""
        notes = "; ".join(c.notes)
        metrics = [m for m in c.metrics if not only_regressions or m.verdict == "regressed"] or [None]
        for m in metrics:
            if m is None:
                (failing if c.regressed else out).append(
                    (c.verdict + ignored, c.cell, "-", c.baseline_status or "-", c.current_status or "-",
                     "-", "-", notes)
                )  # fmt: skip
                continue
            verdict = m.verdict + (ignored if m.verdict == "regressed" else "")
            note = "; ".join(x for x in (m.note, notes) if x)
            (failing if c.regressed and m.verdict == "regressed" else out).append(
                (verdict, c.cell, m.metric, metric_value(m, m.baseline), metric_value(m, m.current),
                 _change(m), _band(m), note)
            )  # fmt: skip
    return failing + out


def summary_line(comparison: Comparison) -> str:
    """The headline, whose counts add up: the cells on both sides (compared), each by its
    verdict; the baseline's cells this run lacks, of how many the baseline has; this run's cells
    the baseline lacks, of how many it has. A missing cell is said apart because nothing was
    measured for it: a run of a part of the baseline passes on that part alone, and the reader
    must see how small that part was."""
    compared = [c for c in comparison.cells if c.verdict not in ("new", "missing")]
    missing = [c for c in comparison.cells if c.verdict == "missing"]
    new = [c for c in comparison.cells if c.verdict == "new"]
    tally = Counter(
        "ignored" if c.ignored and c.verdict in ("regressed", "now failing") else c.verdict for c in compared
    )
    kinds = ", ".join(f"{tally[v]} {v}" for v in (*VERDICTS, "ignored") if tally[v]) or "none"
    wide = strategy_clause(comparison)
    alone = ", each judged alone" if wide else ""
    within = f"{count(len(compared), 'cell')} compared ({kinds}{alone})"
    failed = [c for c in compared if c.regressed]
    slower = comparison.strategy_regressions
    across = ", ".join(f"{s.strategy}'s step time vs {REFERENCE} over all its cells" for s in slower)
    lost = [c for c in missing if c.regressed]
    if len(lost) == len(missing):
        why = "each a regression: a lost measurement"
    elif lost:
        why = f"{len(lost)} of them regressions (lost measurements), {len(missing) - len(lost)} ignored"
    else:
        why = "not measured, so not compared"
    baseline_cells = count(len(compared) + len(missing), "cell")
    absent = f"{len(missing)} of the baseline's {baseline_cells} missing from this run ({why})"
    if failed:
        parts = [f"REGRESSION in {len(failed)} of {within}" + (f"; {across}" if slower else "")]
    elif slower:
        parts = [f"REGRESSION: {across}; no cell regressed alone: {within}"]
    elif lost:  # the lost cells are the regression: they lead
        parts, absent = [f"REGRESSION: {absent}", f"no regression in {within}"], ""
    else:
        parts = [f"no regression in {within}"]
    parts += [wide] if wide else []
    parts += [absent] if missing and absent else []
    if new:
        current_cells = count(len(compared) + len(new), "cell")
        parts.append(f"{len(new)} of this run's {current_cells} new (not in the baseline)")
    return "; ".join([*parts, f"rules: {comparison.rules_source}"])


def strategy_clause(comparison: Comparison) -> str:
    """The strategies whose step time over all their cells moved beyond their band, for the
    headline: a strategy-wide change is judged on the cells' combined noise, so it can stand
    where every cell alone is unchanged, and a headline of cells alone would then deny it."""
    moved = [s for s in comparison.strategies if s.verdict != "unchanged"]
    if not moved:
        return ""
    several = len({s.device for s in comparison.strategies}) > 1
    return f"strategy-wide vs {REFERENCE}: " + ", ".join(
        f"{s.strategy}{f' on {s.device}' if several else ''} {s.verdict} {s.change_pct:+.1f}% over "
        f"{count(len(s.cells), 'cell')} (beyond its {s.band_text} band)"
        for s in moved
    )


def strategy_lines(comparison: Comparison, *, only_moved: bool = False) -> list[str]:
    """Each strategy's step-time ratio to ddp over all its cells (``compare_strategy``);
    ``only_moved``: those regressed or improved beyond their band."""
    return [
        f"{s.verdict}: {s.describe()}"
        for s in comparison.strategies
        if s.verdict != "unchanged" or not only_moved
    ]


def detection_line(comparison: Comparison) -> str | None:
    """Every strategy's combined change and the smallest slowdown the night could have caught
    (``StrategyDelta.detectable_pct``): a clean night says how small a slowdown it would have seen."""
    if not comparison.strategies:
        return None
    several = len({s.device for s in comparison.strategies}) > 1
    parts = ", ".join(
        f"{s.strategy}{f' on {s.device}' if several else ''} {s.change_pct:+.1f}% "
        f"(could detect >= {s.detectable_pct:.1f}%)"
        for s in comparison.strategies
    )
    return (
        f"strategy-wide step time vs {REFERENCE} (the change; the least slowdown caught in "
        f"{POWER:.0%} of nights): {parts}"
    )


def time_rule_line(comparison: Comparison) -> str:
    """How step time was gated: on a shared runner, only the ratios within a run are; and how
    many ratios were too uncertain to judge (one run, a crowded cell), which nothing else says."""
    if comparison.dedicated:
        line = (
            f"step time: gated as each strategy's ratio to {REFERENCE} within its run, and as time itself "
            "(dedicated runner, where each side has enough repeats)"
        )
    else:
        line = (
            f"step time: gated as each strategy's ratio to {REFERENCE} within its run; the time itself is "
            "reported, not gated (shared runner)"
        )
    unjudged = [m for c in comparison.cells for m in c.metrics if m.verdict == NOT_JUDGED]
    if unjudged:
        line += (
            f"; {count(len(unjudged), 'ratio')} not judged, which cannot fail the gate "
            "(one run without repeats, too few timed steps, or ranks that waited for a core: see each row)"
        )
    return line


def env_lines(comparison: Comparison) -> list[str]:
    lines = [f"environment changed: {k}: {b} -> {c}" for k, (b, c) in comparison.env_changes.items()]
    return lines + [f"rule matches no cell (a typo?): {r}" for r in comparison.unmatched_rules]


def to_text(comparison: Comparison) -> str:
    """What ``compare`` prints: the summary, what changed since the baseline, how time was
    gated, each strategy that moved over all its cells and, when there are any, the regressions."""
    lines = [summary_line(comparison), *provenance_lines(comparison.provenance)]
    lines += [time_rule_line(comparison), *env_lines(comparison)]
    lines += [line] if (line := detection_line(comparison)) else []
    wide = strategy_lines(comparison, only_moved=True)
    lines += [f"strategy-wide step time vs {REFERENCE}: {line}" for line in wide]
    regressions = rows(comparison, only_regressions=True)
    if regressions:
        lines.append(markdown_table(COLUMNS, regressions))
    return "\n".join(lines)


def to_markdown(comparison: Comparison, *, baseline: str, current: str) -> str:
    parts = [
        "## shardbench compare",
        f"baseline: `{baseline}`  \ncurrent: `{current}`",
        f"**{summary_line(comparison)}**",
        *(f"- {line}" for line in provenance_lines(comparison.provenance)),
        f"- {time_rule_line(comparison)}",
        *(f"- {line}" for line in env_lines(comparison)),
    ]
    if comparison.strategies:
        parts += [
            f"### Each strategy's step time vs {REFERENCE}, over all its cells",
            "\n".join(f"- {line}" for line in strategy_lines(comparison)),
        ]
    regressions = rows(comparison, only_regressions=True)
    if regressions:
        parts += ["### Regressions", markdown_table(COLUMNS, regressions)]
    parts += ["### Every cell", markdown_table(COLUMNS, rows(comparison))]
    return "\n\n".join(parts) + "\n"


def to_json(comparison: Comparison, *, baseline: str, current: str) -> dict:
    def cell(c: CellDelta) -> dict:
        d = asdict(c)
        d["regressed"] = c.regressed
        for m, md in zip(c.metrics, d["metrics"], strict=True):
            md["change_pct"] = m.change_pct
        return d

    return {
        "baseline": baseline,
        "current": current,
        "exit_code": comparison.exit_code,
        "counts": comparison.counts(),
        "rules": comparison.rules_source,
        "dedicated": comparison.dedicated,
        "env_changes": {k: {"baseline": b, "current": c} for k, (b, c) in comparison.env_changes.items()},
        "provenance": _provenance_json(comparison),
        "strategies": [{**asdict(s), "regressed": s.regressed} for s in comparison.strategies],
        "cells": [cell(c) for c in comparison.cells],
    }


def _provenance_json(comparison: Comparison) -> dict | None:
    """The commits, counts and facts of both sides, and the lines the verdict printed."""
    p = comparison.provenance
    if p is None:
        return None
    return {**asdict(p), "commits": commit_text(p), "lines": provenance_lines(p)}


#: each column's class: the long ones wrap (the note in full, never cut at the window's edge)
_HTML_CLASSES = {
    "verdict": "verdict text",
    "cell": "cell text",
    "metric": "text",
    "baseline": "",
    "current": "",
    "change": "",
    "band": "band",
    "note": "note",
}
_HTML_CSS = """
table.compare { width: 100%; } table.compare th { text-align: left; }
table.compare td.cell, table.compare td.band { white-space: normal; overflow-wrap: break-word; }
table.compare td.note { min-width: 16em; overflow-wrap: break-word; }
tr.regressed td, tr.now-failing td { background: #fde0dc; } tr.regressed td.verdict,
tr.now-failing td.verdict { color: #b71c1c; font-weight: bold; }
tr.improved td.verdict, tr.now-passing td.verdict { color: #1b5e20; }
tr.new td.verdict, tr.missing td.verdict { color: #8a6d00; } tr.ignored td { background: #f3f3f3; }
tr.not-gated td { color: #666; }
"""


def _html_text(column: str, value: str) -> str:
    """A cell's text, escaped; a cell's name may break after each ``/`` (it is one long word)."""
    text = html.escape(value)
    return text.replace("/", "/<wbr>") if column == "cell" else text


def to_html(comparison: Comparison, *, baseline: str, current: str, extra_html: str = "") -> str:
    head = "".join(f'<th class="{_HTML_CLASSES[c]}">{html.escape(c)}</th>' for c in COLUMNS)
    body = []
    for row in rows(comparison):  # the rows that fail the gate first, of every cell
        css = "ignored" if "(ignored:" in row[0] else row[0].replace(" ", "-")
        cells = "".join(
            f'<td class="{_HTML_CLASSES[c]}">{_html_text(c, v)}</td>'
            for c, v in zip(COLUMNS, row, strict=True)
        )
        body.append(f'<tr class="{css}">{cells}</tr>')
    said = (*provenance_lines(comparison.provenance), time_rule_line(comparison), *env_lines(comparison))
    env = "".join(f"<li>{html.escape(line)}</li>" for line in said)
    status = "regression" if comparison.exit_code else "ok"
    wide = "".join(
        f"<li class='{'regressed' if line.startswith('regressed') else ''}'>{html.escape(line)}</li>"
        for line in strategy_lines(comparison)
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>shardbench compare</title>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<style>{CSS}{_HTML_CSS}</style></head><body>"
        f"<h1>shardbench compare: {status}</h1>"
        f"<p class='lead'>baseline <code>{html.escape(baseline)}</code><br>current "
        f"<code>{html.escape(current)}</code></p>"
        f"<p><b>{html.escape(summary_line(comparison))}</b></p>"
        f"{f'<ul>{env}</ul>' if env else ''}"
        f"{f'<h2>Each strategy vs {REFERENCE}, over all its cells</h2><ul>{wide}</ul>' if wide else ''}"
        "<p class='how'>Memory regresses beyond max(tolerance %, a floor, the spread between the "
        "baseline's repeats) of the baseline (the band column), bytes sent on any change; step time "
        f"(its ratio to {REFERENCE}'s in the same run, and on a dedicated runner the time itself) only "
        "beyond both the relative threshold and k x the combined noise, and a ratio of one run is "
        "not judged; each strategy's ratio is also judged over all its cells at once, where noise "
        "averages out and a slowdown in every workload does not. Regressions first.</p>"
        f"<div class='scroll'><table class='compare'><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
        f"{extra_html}</body></html>"
    )


def write_comparison(
    comparison: Comparison, out_dir: Path, *, baseline: str, current: str, extra_html: str = ""
) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "md": out_dir / "compare.md",
        "json": out_dir / "compare.json",
        "html": out_dir / "compare.html",
    }
    paths["md"].write_text(to_markdown(comparison, baseline=baseline, current=current))
    paths["json"].write_text(
        json.dumps(to_json(comparison, baseline=baseline, current=current), indent=1, default=str) + "\n"
    )
    paths["html"].write_text(to_html(comparison, baseline=baseline, current=current, extra_html=extra_html))
    return paths
