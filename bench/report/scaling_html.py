"""The report's scaling-efficiency table: per real cell at N > 1, its per-rank samples/s over
the run's N = 1 cell's, with its noise verdict, or why it has none (bench/studies/scaling.py)."""

from __future__ import annotations

import html
from collections.abc import Sequence

from shardbench.records import Record
from shardbench.report.chart_types import reading_order
from shardbench.report.terminal import group_how
from shardbench.studies.reference import REFERENCE
from shardbench.studies.scaling import scaling_texts

HOW = (
    f"Scaling efficiency: each rank's samples/s at N over {REFERENCE}'s cell at N=1 (the same "
    "workload, preset, precision, per-rank batch and flags, in the same run and repeat; at N=1 every "
    "strategy holds the whole model on one process). 1.00 is ideal scaling. It is called below or "
    "above ideal only beyond the noise of the two step times (the step-time rule of the table above); "
    "a cell whose ranks outnumbered the cores, or each had fewer threads than the N=1 cell, is "
    "flagged and not judged (docs/measuring.md)."
)


def scaling_table(records: Sequence[Record]) -> str:
    """The table as HTML, or "" when no cell has its N=1 cell (nothing asked for it)."""
    texts = scaling_texts(sorted(records, key=reading_order))
    if not texts:
        return ""
    head = "".join(f'<th class="text">{h}</th>' for h in ("workload", "preset", "how", "strategy"))
    rows = [
        f'<tr><td class="text">{html.escape(k.workload)}</td><td class="text">{html.escape(k.preset)}</td>'
        f'<td class="text">{html.escape(group_how(k))}</td><td class="text">{html.escape(k.strategy)}</td>'
        f'<td>{k.world_size}</td><td class="text">{html.escape(text)}</td></tr>'
        for k, text in texts.items()
    ]
    return (
        f'<p class="how">{html.escape(HOW)}</p><div class="scroll"><table>'
        f'<thead><tr>{head}<th>N</th><th class="text">efficiency</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )
