"""The table a person reads in the terminal after a run: the columns read first, at most 120
characters wide, a flag legend instead of repeated notes, and per group of comparable cells a
line of ratios against ddp. The full table (every column) stays in ``table.md``/``table.csv``.

Comparable cells: the same workload, preset, world size, precision, batch, activation
checkpointing and the same simulated/fake mode; ratios are set against ddp's cell of the group,
the step time's with the run's speed verdict (``studies.speed_verdict``): faster or slower only
beyond the spread between repeats, "within noise", or "not judged" (one run; more ranks than
cores).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shardbench.records import CellKey, Record, oversubscription
from shardbench.report.chart_types import reading_order
from shardbench.report.tables import format_value
from shardbench.studies.reference import REFERENCE
from shardbench.studies.speed_verdict import ONE_RUN, REPEAT_HINT, RULE
from shardbench.studies.versus import against_reference, group_key, model_states, repeated
from shardbench.units import size_text
from shardbench.wording import first_sentence, longest_piece, wrap

WIDTH = 120


def bytes_text(n: int | None) -> str:
    return "" if n is None else size_text(n)


def step_text(r: Record) -> str:
    t = r.step_time_s or {}
    if not t.get("median"):
        return ""
    med, mad = t["median"], t.get("mad") or 0.0
    return f"{med:.2f} ± {mad:.2f} s" if med >= 1 else f"{med * 1e3:.0f} ± {mad * 1e3:.0f} ms"


def percent_text(fraction: float | None) -> str:
    """A utilisation as a percentage, three significant figures: 0.00426 reads 0.426%."""
    return "" if fraction is None else f"{fraction * 100:.3g}%"


def tflops_text(r: Record) -> str:
    """The model FLOP/s a rank achieved, in TFLOP/s (three significant figures)."""
    achieved = (r.achieved_flops_per_s or {}).get("model")
    return "" if achieved is None else f"{achieved / 1e12:.3g}"


def _states(r: Record) -> str:
    held, predicted = model_states(r), (r.predicted_mem_bytes or {}).get("total")
    return f"{held / predicted:.3f}" if held and predicted else ""


def _comm_vs_pred(r: Record) -> str:
    sent = (r.comm_per_step or {}).get("sent_per_rank")
    predicted = (r.predicted_comm or {}).get("sent_per_rank")
    return f"{sent / predicted:.3f}" if sent is not None and predicted else ""


def _predicted_vs_measured(r: Record) -> str:
    """The step-time model's prediction over the measured median (``studies.prediction_check``)."""
    from shardbench.studies.prediction_check import predicted_over_measured

    ratio = predicted_over_measured(r)
    return "" if ratio is None else f"{ratio:.2f}"


def flags(r: Record) -> str:
    """Letters for how a cell was measured (see ``LEGEND``)."""
    out = []
    if r.simulated:
        out.append("S")
    if r.fake:
        out.append("F")
    if r.requested_world_size and r.world_size < r.requested_world_size:
        out.append("1")
    if r.activation_checkpointing:
        out.append("AC")
    if crowded := oversubscription(r):
        out.append(CROWDED_FLAGS[crowded])
    return " ".join(out)


#: the flag of a cell whose ranks outnumbered what they ran on (``records.oversubscription``)
CROWDED_FLAGS = {"more ranks than cores": "R>C", "more ranks than devices": "R>D"}


LEGEND = {
    "S": "simulated: rank 0 of a fake world, no communication in its time",
    "F": "fake: planned under FakeTensorMode, nothing allocated, no time",
    "1": "single-device: the strategy ran fewer ranks than requested",
    "AC": "activation checkpointing",
    "R>C": "more ranks than cores: each waited for a core, so its step time is not judged",
    "R>D": "more ranks than devices: each waited for a device, so its step time is not judged",
}


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[Record], str]
    right: bool = False


COLUMNS: dict[str, Column] = {
    "workload": Column("workload", lambda r: r.workload),
    "preset": Column("preset", lambda r: r.preset),
    "params": Column("params", lambda r: f"{r.params / 1e6:.1f}M", right=True),
    "strategy": Column("strategy", lambda r: r.strategy),
    "N": Column("N", lambda r: str(r.world_size), right=True),
    "precision": Column("prec", lambda r: r.precision),
    "batch": Column("batch", lambda r: str(r.batch_size_per_rank), right=True),
    "flags": Column("flags", flags),
    "repeat": Column("repeat", lambda r: str(r.repeat), right=True),
    "status": Column("status", lambda r: r.status),
    "peak": Column("peak", lambda r: bytes_text((r.peak_mem_bytes or {}).get("max")), right=True),
    "states/pred": Column("states/pred", _states, right=True),
    "step": Column("step time", step_text, right=True),
    "throughput": Column(
        "samples/s", lambda r: format_value(r.samples_per_s) if r.samples_per_s else "", right=True
    ),
    "tokens/s": Column(
        "tokens/s", lambda r: format_value(r.tokens_per_s) if r.tokens_per_s else "", right=True
    ),
    "tflops": Column("TFLOP/s", tflops_text, right=True),
    "mfu": Column("MFU", lambda r: percent_text(r.mfu), right=True),
    "hfu": Column("HFU", lambda r: percent_text(r.hfu), right=True),
    "comm": Column(
        "sent/step", lambda r: bytes_text((r.comm_per_step or {}).get("sent_per_rank")), right=True
    ),
    "comm/pred": Column("sent/pred", _comm_vs_pred, right=True),
    "step/pred": Column("pred/meas", _predicted_vs_measured, right=True),
    "error": Column("error", lambda r: first_sentence(r.error) if r.status != "ok" else ""),
}
DEFAULT_COLUMNS = (
    "workload",
    "preset",
    "strategy",
    "N",
    "flags",
    "status",
    "peak",
    "states/pred",
    "step",
    "throughput",
    "mfu",
    "step/pred",
)


def check_columns(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` if every one is a column; ValueError naming the allowed ones otherwise."""
    if unknown := [n for n in names if n not in COLUMNS]:
        raise ValueError(f"unknown column {unknown[0]!r}; allowed: {', '.join(COLUMNS)}")
    return tuple(names)


def ratio_lines(records: Sequence[Record]) -> list[str]:
    """Per group with an ok ddp cell: each other ok strategy's peak, step time and bytes sent
    per step against it (``studies.versus``), the step time's with its speed verdict (how it was
    judged: ``verdict_lines``)."""
    lines = []
    for group in against_reference(records):
        parts = []
        for v in group.others:
            text = f"{v.record.strategy}: "
            text += f"{v.peak:.2f}x peak" if v.peak else "peak unmeasured"
            if v.step_time:
                text += f", {v.step_time:.2f}x step time"
                if v.speed is not None:
                    text += f" ({v.speed.note()})"
            if v.sent:
                text += f", {v.sent:.2f}x bytes sent"
            parts.append(text)
        key = group.key
        how = group_how(key, group.repeat)
        head = f"{key.workload} {key.preset} N={key.world_size} {how} vs {REFERENCE}: "
        lines += wrap(head + "; ".join(parts), WIDTH, indent="  ")
    return lines


def verdict_lines(records: Sequence[Record]) -> list[str]:
    """Under the ratio lines: the rule a ratio of repeats was judged by, where one was, and
    how to have a ratio judged, where one run's was not."""
    verdicts = [v.speed for group in against_reference(records) for v in group.others if v.speed]
    lines = []
    if any(v.pairs > 1 and v.band is not None for v in verdicts):
        lines += wrap(f"step time: {RULE}", WIDTH, indent="  ")
    if any(v.reason == ONE_RUN for v in verdicts):
        lines += wrap(f"step time: {REPEAT_HINT}", WIDTH, indent="  ")
    return lines


def group_how(key: CellKey, repeat: int | None = None) -> str:
    """How a group's cells ran, beside its workload, preset and N: "fp32 b=8 AC simulated", and
    which repeat where the cells were repeated ("repeat 1")."""
    how = [
        key.precision,
        f"b={key.batch_size}",
        "AC" if key.activation_checkpointing else "",
        "fake" if key.fake else "simulated" if key.simulated else "",
        "" if repeat is None else f"repeat {repeat}",
    ]
    return " ".join(h for h in how if h)


#: the narrowest a text column is made to fit the table in ``WIDTH`` (its values then wrap)
NARROWEST = 12


def _fit_widths(cols: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[int]:
    """Each column's width: its longest value, the widest text columns narrowed (down to
    ``NARROWEST``, or the longest piece a value cannot break in) until the table fits in
    ``WIDTH``; their values then wrap (``_render``). Figures keep their width."""
    widths = [max([len(c.header), *(len(row[i]) for row in rows)]) for i, c in enumerate(cols)]
    # a figure ("3.97 ± 0.15 s") is never broken over lines: only text columns narrow
    floors = [
        widths[i] if c.right else max(len(c.header), NARROWEST, *(longest_piece(row[i]) for row in rows))
        for i, c in enumerate(cols)
    ]
    while sum(widths) + 2 * (len(cols) - 1) > WIDTH:
        narrowable = [i for i, c in enumerate(cols) if widths[i] > floors[i]]
        if not narrowable:
            break
        widths[max(narrowable, key=lambda i: widths[i])] -= 1
    return widths


def _render(cols: Sequence[Column], rows: Sequence[Sequence[str]], widths: Sequence[int]) -> str:
    """The table as aligned text, two spaces between columns; a value wider than its column
    wraps within it at word and argument boundaries (``wording.wrap``: an ``hf:`` preset breaks
    after a colon, never inside a name or a number)."""
    justify = [str.rjust if c.right else str.ljust for c in cols]
    lines = ["  ".join(f(c.header, w) for c, f, w in zip(cols, justify, widths, strict=True)).rstrip()]
    for row in rows:
        cells = [wrap(v, w) or [""] for v, w in zip(row, widths, strict=True)]
        for k in range(max(len(c) for c in cells)):
            parts = [f(c[k] if k < len(c) else "", w) for c, f, w in zip(cells, justify, widths, strict=True)]
            lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def terminal_table(records: Sequence[Record], columns: Sequence[str] = DEFAULT_COLUMNS) -> str:
    """The summary as text: the table (at most ``WIDTH`` columns), the legend of the flags that
    occur and the ratio lines."""
    records = sorted(records, key=reading_order)  # as table.md and the charts list them
    if not any(r.predicted_step_time for r in records):  # nothing predicted: no column to fill
        columns = tuple(c for c in columns if c != "step/pred")
    cols = [COLUMNS[c] for c in columns]
    if repeated(records) and "repeat" not in columns:  # which repeat a row is, beside its strategy
        cols.insert(columns.index("strategy") + 1 if "strategy" in columns else 0, COLUMNS["repeat"])
    rows = [[c.value(r) for c in cols] for r in records]
    text = _render(cols, rows, _fit_widths(cols, rows))
    if "error" not in columns:  # under the table, each on lines of its own: a column would be narrow
        text = "\n".join([text, *error_lines(records)])
    used = sorted({f for r in records for f in flags(r).split()}, key=list(LEGEND).index)
    legend = [f"{f} = {LEGEND[f]}" for f in used]
    extra = "\n".join(wrap("flags: " + "; ".join(legend), WIDTH)) if legend else ""
    if {"mfu", "hfu", "tflops"} & set(columns):
        extra = "\n".join(part for part in (extra, *peak_lines(records)) if part)
    lines = ratio_lines(records) + verdict_lines(records) + exposed_lines(records) + scaling_lines(records)
    if "step/pred" in columns:
        from shardbench.studies.prediction_check import error_line

        lines += wrap(error_line(records) or "", WIDTH, indent="  ")
    return "\n".join(part for part in (text, extra, "\n".join(lines)) if part)


def peak_lines(records: Sequence[Record]) -> list[str]:
    """Which peak each MFU was set against, once per distinct peak: "MFU against 0.212 TFLOP/s,
    the measured peak of <CPU> at fp32, 1 thread (docs/measuring.md)"."""
    seen: dict[str, None] = {}
    for r in records:
        p = r.peak_flops_per_s
        if r.mfu is None or not p:
            continue
        threads = f", {p['threads']} thread{'s' if p['threads'] != 1 else ''}" if p.get("threads") else ""
        seen[
            f"MFU against {p['flops_per_s'] / 1e12:.3g} TFLOP/s, the {p.get('kind')} peak of "
            f"{p.get('device_name')} at {p.get('dtype')}{threads} (docs/measuring.md)"
        ] = None
    return [line for text in seen for line in wrap(text, WIDTH, indent="  ")]


def error_lines(records: Sequence[Record]) -> list[str]:
    """Each failed cell's exception and the first sentence of its message, whole, wrapped
    under the table (the whole error, traceback included, is in the run's ``errors/``)."""
    lines = []
    for r in records:
        if r.status != "ok" and r.error:
            repeat = f" repeat {r.repeat}" if repeated(records) else ""
            head = f"{r.status}: {r.workload} {r.preset} {r.strategy} N={r.world_size}{repeat}: "
            lines += wrap(head + first_sentence(r.error), WIDTH, indent="  ")
    return lines


def exposed_lines(records: Sequence[Record]) -> list[str]:
    """Per real-rank group whose cells have simulated twins: each strategy's exposed
    communication, the share of its step that compute did not hide (bench/studies/exposed_comm.py)."""
    from shardbench.studies.exposed_comm import exposed_comm

    exposed = exposed_comm(records)
    groups: dict[CellKey, list[str]] = {}
    for r in records:
        if id(r) in exposed:
            groups.setdefault(group_key(r), []).append(f"{r.strategy} {exposed[id(r)].text()}")
    lines = []
    for key, parts in groups.items():
        ac = " AC" if key.activation_checkpointing else ""
        head = (
            f"{key.workload} {key.preset} N={key.world_size} {key.precision} b={key.batch_size}{ac} "
            "exposed communication: "
        )
        lines += wrap(head + ", ".join(parts), WIDTH, indent="  ")
    return lines


def scaling_lines(records: Sequence[Record]) -> list[str]:
    """Per group of real cells across world sizes, where any has its N=1 cell: each cell's
    scaling efficiency against it and its verdict, or why it has none
    (bench/studies/scaling.py)."""
    from shardbench.studies.scaling import scaling_texts

    groups: dict[tuple, list[str]] = {}
    for key, text in scaling_texts(records).items():
        groups.setdefault(key.without("strategy", "world_size"), []).append(
            f"{key.strategy} N={key.world_size} {text}"
        )
    lines = []
    for key, parts in groups.items():
        workload, preset, _sim, _fake, ac, precision, batch, _device = key
        head = (
            f"{workload} {preset} {precision} b={batch}{' AC' if ac else ''} scaling efficiency "
            f"(per-rank samples/s over {REFERENCE} N=1): "
        )
        lines += wrap(head + ", ".join(parts), WIDTH, indent="  ")
    return lines
