"""The head of a plan's page: the budget, the reserve kept below it and the recommendation, then
the plan's table, as ``plan`` printed them (``plan_report.plan_json``, kept beside the records as
``plan.json``). What a planner came for comes first; the charts follow."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shardbench.report.plan_report import PLAN_JSON
from shardbench.report.summary_html import breakable
from shardbench.units import size_text


def read_plan(run_dir: Path) -> dict[str, Any] | None:
    """The plan summary a ``plan`` run left in ``run_dir``, or None (not a plan, or unreadable:
    the report of its records is still worth writing)."""
    path = run_dir / PLAN_JSON
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return plan if isinstance(plan, dict) and "budget_bytes" in plan else None


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _size(nbytes: int | None) -> str:
    """A lone size (the budget, the reserve) in the unit that keeps three figures: a 0.3 MiB
    reserve in a 1 GiB budget reads ``307 KiB``, not ``0.00 GiB``."""
    return size_text(nbytes) if nbytes else "0"


def plan_lead(plan: Mapping[str, Any]) -> str:
    """The plan's section: its facts in one row, its verdict, and its table (the page's first)."""
    budget = int(plan["budget_bytes"])
    best = plan.get("recommended")
    chosen = next((r for r in plan.get("rows") or [] if r.get("strategy") == best), None)
    reserve = _size(chosen.get("reserve_bytes")) if chosen else "per strategy (the table)"
    facts = [
        ("budget per rank", _size(budget)),
        ("reserve", reserve),
        ("recommended", best or "nothing fits"),
    ]
    dl = "".join(f"<div><dt>{_e(k)}</dt><dd>{_e(v)}</dd></div>" for k, v in facts)
    columns = list(plan.get("columns") or [])
    text = [i < 2 or c == "fits" for i, c in enumerate(columns)]  # left-aligned, as in the terminal
    head = "".join(
        f'<th class="text">{_e(c)}</th>' if t else f"<th>{_e(c)}</th>"
        for c, t in zip(columns, text, strict=True)
    )
    body = []
    for row in plan.get("table") or []:
        cls = ' class="recommended"' if best and row and row[0] == best else ""
        cells = "".join(
            f'<td class="text">{_e(v)}</td>' if i < len(text) and text[i] else f"<td>{_e(v)}</td>"
            for i, v in enumerate(row)
        )
        body.append(f"<tr{cls}>{cells}</tr>")
    notes = [plan[k] for k in ("reserve", "kernels") if plan.get(k)]
    kernels = "".join(f'<p class="how">{_e(n)}</p>' for n in notes)
    return (
        f'<section class="plan"><h2>{breakable(plan.get("title") or "Plan")}</h2>'
        f'<dl class="facts">{dl}</dl><p class="verdict">{breakable(plan.get("verdict", ""))}</p>'
        f'<div class="scroll"><table class="summary" id="plan"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>{kernels}</section>"
    )
