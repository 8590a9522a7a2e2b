"""The report's first table, the verdict: per group of comparable cells, each strategy against
ddp, as ``studies.versus`` sets them (the ratios the terminal prints, and the same noise rule).

One row per strategy, ddp's first as the reference: its peak, model states, step time and bytes
sent per step, each beside its ratio to ddp's. A step-time ratio carries the run's speed verdict
(``studies.speed_verdict``): faster or slower only beyond what a rerun would show, "within
noise", or "not judged" and why. A cell of the group that failed keeps its row, with its status.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from shardbench.records import CellKey, Record
from shardbench.report.chart_types import reading_order
from shardbench.report.tables import error_file
from shardbench.report.terminal import bytes_text, group_how, percent_text, step_text
from shardbench.studies.reference import REFERENCE
from shardbench.studies.speed_verdict import RULE
from shardbench.studies.versus import Versus, against_reference, group_key, model_states, repeated
from shardbench.wording import first_sentence

#: the leading columns, then per metric its value and its ratio to ddp's
KEY_HEAD = ("workload", "preset", "N", "how", "strategy")
METRICS = ("peak", "model states", "step time", "MFU", "sent per step")

HOW = (
    f"Each strategy against {REFERENCE} in the same cell (workload, preset, N, precision, batch, "
    f"real or simulated): below 1× is less memory or a faster step than {REFERENCE}'s. Peak is the "
    "highest rank's; model states are params + grads + optimizer state after a step; a step time "
    "is the slowest rank's median ± MAD. Its ratio is called faster or slower only beyond what a "
    f"rerun of the same code would show: with repeats (run --repeat), {RULE}; one run's ratio is "
    '"within noise" where 3× its cells\' combined MAD holds 1 and lies as narrowly, and "not judged" '
    "otherwise; a cell with more ranks than cores is never judged. Sent per step is what one rank "
    "sends in a steady step. MFU is one rank's model FLOPs per step over the median step time, "
    "against the device's peak (a datasheet's, or this machine's measured GEMM peak: "
    "docs/measuring.md); its ratio to ddp's is the inverse of the step-time ratio, judged alike."
)


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def breakable(text: str) -> str:
    """``text`` escaped, a line allowed to break after each ``:`` and ``,`` (an ``hf:`` config
    is one long word otherwise, which would widen its column or break inside a number)."""
    return _e(text).replace(":", ":<wbr>").replace(",", ",<wbr>")


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}×"


def _speed_ratio(v: Versus, ratio: float | None, *, of_step_time: bool = True) -> str:
    """A ratio of speed (step time, or MFU, its inverse), with what the noise rule says of the
    step times (beside MFU's ratio without the step times' own ratio and band); the rule's own
    words in a tooltip."""
    if ratio is None:
        return "<td></td>"
    if v.speed is None:
        return f"<td>{_ratio(ratio)}</td>"
    cls = "beyond" if v.speed.judged else "noise"
    text = _ratio(ratio) + f' <span class="{cls}">{_e(v.speed.note(with_ratio=of_step_time))}</span>'
    return f'<td title="{_e(v.speed.rule)}">{text}</td>'


def _mfu_ratio(v: Versus) -> float | None:
    return v.record.mfu / v.base.mfu if v.record.mfu and v.base.mfu else None


def _values(r: Record) -> list[str]:
    """The cell's own value of each of ``METRICS``, as the terminal writes them."""
    return [
        bytes_text((r.peak_mem_bytes or {}).get("max")),
        bytes_text(model_states(r)),
        step_text(r),
        percent_text(r.mfu),
        bytes_text((r.comm_per_step or {}).get("sent_per_rank")),
    ]


def _ratios(v: Versus) -> list[str]:
    return [
        f"<td>{_ratio(v.peak)}</td>",
        f"<td>{_ratio(v.model_states)}</td>",
        _speed_ratio(v, v.step_time),
        _speed_ratio(v, _mfu_ratio(v), of_step_time=False),
        f"<td>{_ratio(v.sent)}</td>",
    ]


def summary_table(records: Sequence[Record]) -> str:
    """The table as HTML, or "" when no group has a ddp cell and another strategy. A metric no
    cell has (step time, where every cell was planned) has no columns."""
    records = sorted(records, key=reading_order)
    groups = against_reference(records)
    if not groups:
        return ""
    by_repeat = repeated(records)
    failed: dict[tuple[CellKey, int | None], list[Record]] = {}
    for r in records:
        if r.status != "ok" and not r.max_size:
            failed.setdefault((group_key(r), r.repeat if by_repeat else None), []).append(r)
    shown = [
        i
        for i in range(len(METRICS))
        if any(_values(r)[i] for g in groups for r in (g.base, *(v.record for v in g.others)))
    ]
    body = []
    for group in groups:
        rows: list[tuple[str, str]] = []  # (the row's class, its cells)
        base = _values(group.base)
        own = "".join(f"<td>{base[i]}</td><td>{'1×' if base[i] else ''}</td>" for i in shown)
        rows.append(("reference", f'<td class="text">{REFERENCE}</td>{own}'))
        for v in group.others:
            values, ratios = _values(v.record), _ratios(v)
            cells = "".join(f"<td>{values[i]}</td>{ratios[i]}" for i in shown)
            rows.append(("", f'<td class="text">{_e(v.record.strategy)}</td>{cells}'))
        for r in failed.get((group.key, group.repeat), []):
            what = f"{r.status}: {first_sentence(r.error)}" if r.error else r.status
            link = f' (<a href="{_e(name)}">traceback</a>)' if (name := error_file(r)) else ""
            rows.append(
                (
                    "failed",
                    f'<td class="text">{_e(r.strategy)}</td>'
                    f'<td class="text status-fail" colspan="{2 * len(shown)}">{_e(what)}{link}</td>',
                )
            )
        key, span = group.key, f' rowspan="{len(rows)}"'
        lead = (
            f'<td class="text"{span}>{_e(key.workload)}</td>'
            f'<td class="text preset"{span}>{breakable(key.preset)}</td>'
            f'<td{span}>{key.world_size}</td><td class="text"{span}>{_e(group_how(key, group.repeat))}</td>'
        )
        cells = [(cls, lead + tds if i == 0 else tds) for i, (cls, tds) in enumerate(rows)]
        body.append(
            '<tbody class="group">'
            + "".join(f'<tr class="{cls}">{tds}</tr>' if cls else f"<tr>{tds}</tr>" for cls, tds in cells)
            + "</tbody>"
        )
    head = "".join(f'<th class="text">{_e(h)}</th>' if h != "N" else "<th>N</th>" for h in KEY_HEAD)
    head += "".join(f"<th>{_e(METRICS[i])}</th><th>× {REFERENCE}</th>" for i in shown)
    return (
        f'<p class="how">{_e(HOW)}</p><div class="scroll"><table class="summary" id="summary">'
        f"<thead><tr>{head}</tr></thead>{''.join(body)}</table></div>"
    )
