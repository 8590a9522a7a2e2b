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

from shardbench.records import CellKey, Record, oversubscription, strategy_label
from shardbench.report.chart_types import reading_order
from shardbench.studies.reference import REFERENCE
from shardbench.studies.speed_verdict import ONE_RUN, REPEAT_HINT, RULE
from shardbench.studies.versus import against_reference, group_key, model_states, repeated
from shardbench.units import count_text, size_text
from shardbench.wording import count, first_sentence, longest_piece, wrap

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


def _number(value: float | None) -> str:
    # imported here: the help of ``run`` lists the columns, and tables.py brings pandas
    from shardbench.report.tables import format_value

    return format_value(value) if value else ""


def _rate(value: float | None) -> str:
    """A rate that runs to millions (a GPU job's tokens/s) with its scale, as the plan shows it:
    ``51.5M``, not ``51545091``."""
    return count_text(value) if value else ""


def _per_rank(value: float | None, r: Record) -> float | None:
    """A whole job's rate (all ranks together) per rank: per GPU on CUDA, as torchtitan,
    Megatron and llm-foundry report tokens/s."""
    return value / r.world_size if value and r.world_size else None


def _predicted_vs_measured(r: Record) -> str:
    """The step-time model's prediction over the measured median (``prediction.accuracy``)."""
    from shardbench.prediction.accuracy import predicted_over_measured

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


#: the terminal table's columns, each chosen by its header: the key ``--columns`` takes is the
#: header a person reads above it
COLUMNS: dict[str, Column] = {
    c.header: c
    for c in (
        Column("workload", lambda r: r.workload),
        Column("preset", lambda r: r.preset),
        Column("params", lambda r: f"{r.params / 1e6:.1f}M", right=True),
        Column("strategy", strategy_label),
        Column("N", lambda r: str(r.world_size), right=True),
        Column("prec", lambda r: r.precision),
        Column("batch", lambda r: str(r.batch_size_per_rank), right=True),
        Column("flags", flags),
        Column("repeat", lambda r: str(r.repeat), right=True),
        Column("status", lambda r: r.status),
        Column("peak", lambda r: bytes_text((r.peak_mem_bytes or {}).get("max")), right=True),
        Column("states/pred", _states, right=True),
        Column("step", step_text, right=True),
        Column("samples/s", lambda r: _number(r.samples_per_s), right=True),
        Column("tokens/s/rank", lambda r: _rate(_per_rank(r.tokens_per_s, r)), right=True),
        Column("tokens/s/job", lambda r: _rate(r.tokens_per_s), right=True),
        Column("TFLOP/s", tflops_text, right=True),
        Column("MFU", lambda r: percent_text(r.mfu), right=True),
        Column("HFU", lambda r: percent_text(r.hfu), right=True),
        Column("sent/step", lambda r: bytes_text((r.comm_per_step or {}).get("sent_per_rank")), right=True),
        Column("sent/pred", _comm_vs_pred, right=True),
        Column("pred/meas", _predicted_vs_measured, right=True),
        Column("error", lambda r: first_sentence(r.error) if r.status != "ok" else ""),
    )
}
#: other names a column answers to (scripts written against them keep working); a key is
#: matched without regard to case, so ``mfu`` is ``MFU``
ALIASES = {
    "precision": "prec",
    "step time": "step",
    "throughput": "samples/s",
    "tokens/s": "tokens/s/job",
    "tflops": "TFLOP/s",
    "comm": "sent/step",
    "comm/pred": "sent/pred",
    "step/pred": "pred/meas",
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
    "samples/s",
    "MFU",
    "pred/meas",
)
_KEYS = {k.lower(): k for k in COLUMNS} | {a.lower(): k for a, k in ALIASES.items()}
#: what names a row: a table keeps them whatever ``--columns`` chose, since a figure read without
#: its workload and strategy belongs to no cell
IDENTITY = ("workload", "strategy")
#: what else tells cells apart: kept where the rows differ in it, so no two rows read the same
DISTINGUISHING = ("preset", "N", "prec", "batch", "flags")


def check_columns(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` as the headers they choose (a header in any case, or an alias); ValueError
    naming the allowed ones otherwise."""
    if unknown := [n for n in names if n.strip().lower() not in _KEYS]:
        raise ValueError(f"unknown column {unknown[0]!r}; allowed: {', '.join(COLUMNS)} (the headers)")
    return tuple(_KEYS[n.strip().lower()] for n in names)


def with_identity(columns: Sequence[str], records: Sequence[Record]) -> tuple[str, ...]:
    """``columns``, after those that say which cell a row is and that ``columns`` left out, in
    the table's usual order: ``IDENTITY`` always, each of ``DISTINGUISHING`` where ``records``
    differ in it."""
    varies = {c for c in DISTINGUISHING if len({COLUMNS[c].value(r) for r in records}) > 1}
    added = [c for c in COLUMNS if c not in columns and (c in IDENTITY or c in varies)]
    return (*added, *columns)


def ratio_lines(records: Sequence[Record]) -> list[str]:
    """Per group with an ok ddp cell: each other ok strategy's peak, step time and bytes sent
    per step against it (``studies.versus``), the step time's with its speed verdict (how it was
    judged: ``verdict_lines``)."""
    lines = []
    for group in against_reference(records):
        parts = []
        for v in group.others:
            text = f"{strategy_label(v.record)}: "
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


#: the narrowest a text column is made to fit the table in ``WIDTH``
NARROWEST = 12
#: the one text column whose values wrap within it rather than being shortened: a sentence cut
#: in its middle would no longer say what went wrong
SENTENCE_COLUMNS = ("error",)
ELLIPSIS = "…"
SHORTENED = f"{ELLIPSIS} = shortened to fit {WIDTH} columns; table.md has each name whole"


def _fit_widths(cols: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[int]:
    """Each column's width: its longest value, the widest text columns narrowed (down to
    ``NARROWEST``; an error down to the longest piece it cannot break in) until the table fits
    in ``WIDTH``. Figures keep their width: "3.97 ± 0.15 s" is never shortened nor broken."""
    widths = [max([len(c.header), *(len(row[i]) for row in rows)]) for i, c in enumerate(cols)]
    floors = [
        widths[i]
        if c.right
        else max(len(c.header), NARROWEST, *(longest_piece(row[i]) for row in rows))
        if c.header in SENTENCE_COLUMNS
        else min(widths[i], max(len(c.header), NARROWEST))
        for i, c in enumerate(cols)
    ]
    while sum(widths) + 2 * (len(cols) - 1) > WIDTH:
        narrowable = [i for i, c in enumerate(cols) if widths[i] > floors[i]]
        if not narrowable:
            break
        widths[max(narrowable, key=lambda i: widths[i])] -= 1
    return widths


def middle_ellipsis(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, its middle replaced by an ellipsis: a long name
    keeps its start and its end, where names differ (``lightning:…:LitTransformer``,
    ``hf:GPT2LMHeadModel``'s first and last config items)."""
    if len(text) <= width:
        return text
    keep = width - len(ELLIPSIS)
    head = (keep + 1) // 2
    return text[:head] + ELLIPSIS + text[len(text) - (keep - head) :]


def _cell_lines(column: Column, value: str, width: int) -> list[str]:
    """A value's lines in its column: a name or a figure on one line (a name too long for the
    column shortened in its middle), a sentence wrapped at word and argument boundaries."""
    if column.header in SENTENCE_COLUMNS:
        return wrap(value, width) or [""]
    return [middle_ellipsis(value, width)]


def _render(cols: Sequence[Column], rows: Sequence[Sequence[str]], widths: Sequence[int]) -> str:
    """The table as aligned text, two spaces between columns, one line per row (but for an
    error's sentence, which wraps within its column)."""
    justify = [str.rjust if c.right else str.ljust for c in cols]
    lines = ["  ".join(f(c.header, w) for c, f, w in zip(cols, justify, widths, strict=True)).rstrip()]
    for row in rows:
        cells = [_cell_lines(c, v, w) for c, v, w in zip(cols, row, widths, strict=True)]
        for k in range(max(len(c) for c in cells)):
            parts = [f(c[k] if k < len(c) else "", w) for c, f, w in zip(cells, justify, widths, strict=True)]
            lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def terminal_table(records: Sequence[Record], columns: Sequence[str] = DEFAULT_COLUMNS) -> str:
    """The summary as text: the table (at most ``WIDTH`` columns, one line per cell), the
    legend of the flags that occur and the ratio lines. ``columns``: headers or their aliases
    (``check_columns``)."""
    columns = with_identity(check_columns(columns), records)
    records = sorted(records, key=reading_order)  # as table.md and the charts list them
    if not any(r.predicted_step_time for r in records):  # nothing predicted: no column to fill
        columns = tuple(c for c in columns if c != "pred/meas")
    cols = [COLUMNS[c] for c in columns]
    if repeated(records) and "repeat" not in columns:  # which repeat a row is, beside its strategy
        cols.insert(columns.index("strategy") + 1 if "strategy" in columns else 0, COLUMNS["repeat"])
    rows = [[c.value(r) for c in cols] for r in records]
    widths = _fit_widths(cols, rows)
    text = _render(cols, rows, widths)
    if "error" not in columns:  # under the table, each on lines of its own: a column would be narrow
        text = "\n".join([text, *error_lines(records)])
    shortened = any(
        len(v) > w and c.header not in SENTENCE_COLUMNS
        for row in rows
        for c, v, w in zip(cols, row, widths, strict=True)
    )
    used = sorted({f for r in records for f in flags(r).split()}, key=list(LEGEND).index)
    legend = [f"{f} = {LEGEND[f]}" for f in used]
    extra = "\n".join(
        [
            *([SHORTENED] if shortened else []),
            *(wrap("flags: " + "; ".join(legend), WIDTH) if legend else []),
        ]
    )
    if {"MFU", "HFU", "TFLOP/s"} & set(columns):
        extra = "\n".join(part for part in (extra, *peak_lines(records)) if part)
    extra = "\n".join(part for part in (extra, *blank_lines(records, columns)) if part)
    lines = ratio_lines(records) + verdict_lines(records) + exposed_lines(records) + scaling_lines(records)
    lines += thread_peak_lines(records)
    if "pred/meas" in columns:
        from shardbench.prediction.accuracy import error_line

        lines += wrap(error_line(records) or "", WIDTH, indent="  ")
    return "\n".join(part for part in (text, extra, "\n".join(lines)) if part)


def peak_lines(records: Sequence[Record]) -> list[str]:
    """Which peak each MFU was set against, once per distinct peak: "MFU against 0.212 TFLOP/s,
    the measured peak of <CPU> at fp32, 1 thread (docs/measuring.md)". Where the rows were set
    against different peaks (a CPU's at N=1 with every thread, at N=2 with half as many each),
    each line says whose: "MFU at N=1 against ...", "MFU at N=2 against ..."."""
    seen: dict[str, list[Record]] = {}
    for r in records:
        p = r.peak_flops_per_s
        if r.mfu is None or not p:
            continue
        threads = f", {p['threads']} thread{'s' if p['threads'] != 1 else ''}" if p.get("threads") else ""
        seen.setdefault(
            f"against {p['flops_per_s'] / 1e12:.3g} TFLOP/s, the {p.get('kind')} peak of "
            f"{p.get('device_name')} at {p.get('dtype')}{threads} (docs/measuring.md)",
            [],
        ).append(r)
    whose = _whose(list(seen.values())) if len(seen) > 1 else [""] * len(seen)
    texts = [f"MFU{rows} {text}" for text, rows in zip(seen, whose, strict=True)]
    return [line for text in texts for line in wrap(text, WIDTH, indent="  ")]


#: what rows are told apart by in ``_whose``, in the order tried, as the table shows it; the
#: last names each row
_ROW_KEYS: tuple[tuple[str, Callable[[Record], tuple[str, ...]]], ...] = (
    ("at", lambda r: (f"N={r.world_size}",)),
    ("at", lambda r: (r.precision,)),
    ("at", lambda r: (f"N={r.world_size}", r.precision)),
    ("of", lambda r: (r.workload, r.preset, strategy_label(r), f"N={r.world_size}", r.precision)),
)


def _whose(groups: Sequence[Sequence[Record]]) -> list[str]:
    """For each group of rows, the words that name its rows and no other group's: " at N=1",
    " at N=2, 4", " at bf16", " at N=1 bf16", or " of" the rows themselves; the first of
    ``_ROW_KEYS`` that tells the groups apart."""
    word, named = "", []
    for preposition, key in _ROW_KEYS:
        word, named = preposition, [sorted({key(r) for r in rows}, key=_natural) for rows in groups]
        if all(not set(a) & set(b) for i, a in enumerate(named) for b in named[i + 1 :]):
            break
    return [f" {word} " + ", ".join(" ".join(k) for k in keys) for keys in named]


def _natural(key: tuple[str, ...]) -> tuple:
    """N=2 before N=16."""
    return tuple((int(k[2:]), "") if k.startswith("N=") and k[2:].isdigit() else (0, k) for k in key)


#: the figure columns whose cell can be blank in an ok row, and so say why under the table
_FIGURES = ("samples/s", "tokens/s/rank", "tokens/s/job", "TFLOP/s", "MFU", "HFU", "pred/meas")
_TOKENS = ("tokens/s/rank", "tokens/s/job")
#: a blank cell's reason is named by its rows up to this many, beyond it counted
_NAMED_ROWS = 4
#: why a simulated row has no throughput and no prediction checked against its time
SIMULATED_BLANK = "simulated: its step time has no communication in it"


def blank_reason(r: Record, column: str) -> str | None:
    """Why an ok row's ``column`` (one of ``_FIGURES``) is blank, the record's own words where
    its note has them; None where the cell is not blank, or another line already says why (a
    failed cell's error; a fake cell's flag: nothing timed)."""
    if r.status != "ok" or column not in _FIGURES or COLUMNS[column].value(r):
        return None
    if not (r.step_time_s or {}).get("median"):
        return None if r.fake else "no step timed"
    if r.simulated and column in ("samples/s", *_TOKENS, "pred/meas"):
        return SIMULATED_BLANK
    if column == "samples/s":  # a timed step's, FLOPs or none
        return "no samples/s in the record"
    if not r.flops_per_step:
        return _flops_reason(r)
    if column in _TOKENS:
        return (
            "the workload's samples are not token sequences"
            if not r.flops_per_step.tokens_per_sample
            else None
        )
    if column in ("MFU", "HFU") and not r.peak_flops_per_s:
        return _note_part(r.note, "no peak FLOP/s") or "no peak FLOP/s for the device"
    if column == "pred/meas":
        return _note_part(r.note, "no step time predicted") or "no step time predicted"
    return None


def _flops_reason(r: Record) -> str:
    return _note_part(r.note, "FLOPs not counted") or "no FLOPs counted in the record"


def _note_part(note: str, prefix: str) -> str | None:
    """The part of a record's note (parts joined by "; ") that starts with ``prefix``, with the
    parenthesis that follows it whole even where the text inside has "; " of its own."""
    at = note.find(prefix)
    if at < 0:
        return None
    depth = 0
    for i in range(at, len(note)):
        if note[i] == "(":
            depth += 1
        elif note[i] == ")":
            depth -= 1
        elif depth == 0 and note.startswith("; ", i):
            return note[at:i]
    return note[at:]


def blank_lines(records: Sequence[Record], columns: Sequence[str]) -> list[str]:
    """Under the table, why each blank figure of an ok row is blank, once per reason: "MFU,
    pred/meas blank for ddp N=2: FLOPs not counted (AssertionError: ...)"."""
    shown = [c for c in columns if c in _FIGURES]  # in the table's order
    if "pred/meas" in shown and not any(r.predicted_step_time for r in records):
        shown.remove("pred/meas")  # the column is left out altogether (``terminal_table``)
    reasons: dict[tuple[str, tuple[str, ...]], list[Record]] = {}
    for r in records:
        why: dict[str, list[str]] = {}
        for column in shown:
            if (reason := blank_reason(r, column)) is not None:
                why.setdefault(reason, []).append(column)
        for reason, blank in why.items():
            reasons.setdefault((reason, tuple(blank)), []).append(r)
    lines = []
    for (reason, blank), rows in reasons.items():
        text = f"{', '.join(blank)} blank for {_rows_text(rows, records)}: {reason}"
        lines += wrap(text, WIDTH, indent="  ")
    return lines


def _rows_text(rows: Sequence[Record], records: Sequence[Record]) -> str:
    """The rows, each by what tells it from the table's other rows (its strategy and N, its
    workload, preset, precision and repeat where those differ), or how many where many."""
    if len(rows) > _NAMED_ROWS:
        return f"{len(rows)} rows"

    def varies(field: Callable[[Record], object]) -> bool:
        return len({field(r) for r in records}) > 1

    parts: list[Callable[[Record], str]] = [
        *([lambda r: r.workload] if varies(lambda r: r.workload) else []),
        *([lambda r: r.preset] if varies(lambda r: r.preset) else []),
        strategy_label,
        lambda r: f"N={r.world_size}",
        *([lambda r: r.precision] if varies(lambda r: r.precision) else []),
        *([lambda r: f"repeat {r.repeat}"] if repeated(records) else []),
    ]
    return ", ".join(" ".join(p(r) for p in parts) for r in rows)


def error_lines(records: Sequence[Record]) -> list[str]:
    """Each failed cell's exception and the first sentence of its message, whole, wrapped
    under the table (the whole error, traceback included, is in the run's ``errors/``)."""
    lines = []
    for r in records:
        if r.status != "ok" and r.error:
            repeat = f" repeat {r.repeat}" if repeated(records) else ""
            head = f"{r.status}: {r.workload} {r.preset} {strategy_label(r)} N={r.world_size}{repeat}: "
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
            groups.setdefault(group_key(r), []).append(f"{strategy_label(r)} {exposed[id(r)].text()}")
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
        shards = "" if key.shard_group is None else f" S={key.shard_group}"
        groups.setdefault(key.without("strategy", "world_size"), []).append(
            f"{key.strategy}{shards} N={key.world_size} {text}"
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


def _measured_peaks(records: Sequence[Record]) -> dict[tuple[str, str], dict[int, float]]:
    """{(device, dtype): {threads: measured peak FLOP/s}} of the peaks ``records`` were set
    against."""
    peaks: dict[tuple[str, str], dict[int, float]] = {}
    for r in records:
        p = r.peak_flops_per_s or {}
        if p.get("kind") == "measured" and p.get("threads") and p.get("flops_per_s"):
            device = (p.get("device_name", ""), p.get("dtype", ""))
            peaks.setdefault(device, {})[p["threads"]] = p["flops_per_s"]
    return peaks


def thread_peak_lines(records: Sequence[Record]) -> list[str]:
    """Where rows ran at different threads a rank (a CPU host's N=1 cell has every core, each
    of N=2's ranks half) and the measured peak at more threads is no higher than at fewer: a
    second thread gained nothing when it was measured, as on cores shared with other work. The
    rows at those threads then read wrong against the others (their step time, MFU, pred/meas,
    and the scaling efficiencies set against N=1), and a line says so."""
    lines = []
    for (device, dtype), by_threads in _measured_peaks(records).items():
        for more in sorted(by_threads):
            fewer = [t for t in by_threads if t < more and by_threads[t] >= by_threads[more]]
            if not fewer:
                continue
            least = min(fewer)
            ran = {r.world_size for r in records if (r.peak_flops_per_s or {}).get("threads") == more}
            rows = "N=" + ", ".join(map(str, sorted(ran)))
            against = ", and the scaling efficiencies set against N=1," if 1 in ran else ""
            peaks = f"{by_threads[more] / 1e12:.3g} against {by_threads[least] / 1e12:.3g} TFLOP/s"
            text = (
                f"{rows} ran {more} threads a rank, and {more} threads measured a peak no higher than "
                f"{count(least, 'thread')} ({peaks}, {device} {dtype}): the cores were not free for them "
                f"(other work on the machine), so {rows}'s step time, MFU and pred/meas{against} do not "
                "say what the strategy costs"
            )
            lines += wrap(text, WIDTH, indent="  ")
    return lines
