"""A nightly history as time series: one per cell and metric, ready to draw.

The nightly job appends one JSON line per cell per night to ``results/history/<suite>.jsonl``:
``suite``, ``run_id``, ``name``, ``time``, ``cell`` (a stable label), the record's ``status``, the
cell's ``verdict`` and ``metrics``, each ``{value, baseline, low, high, verdict, unit}`` with any
number null (a failed cell has no value, a new one no baseline) and any metric absent. This
module reads it back and turns it into ``Series``. Pure: no matplotlib, no torch, so what a
trend chart shows is a question about lists, and tests ask it.

The history is written by many nights of possibly different code, so reading is forgiving the
way ``shardbench.records.read_records`` is: a line that is not a history line is named by
file and line, skipped with a warning, and never hides the good ones.

A failed night stays in every series of its cell, with no value: a chart must show the night a
cell started failing, not close the gap over it.

A chart shows the gate as it is (``compare.gated``): a band and a verdict only on nights where
the gate can fail the metric. Absolute step time is gated on a dedicated runner only, so a night
of a shared one, or of a line that does not say which (schema 1, whose band for it may come from
another rule), shows its value and baseline without either. A metric the gate gates that the
nights do not hold (a schema 1 line may lack the step-time ratio and bytes sent) is named
(``unrecorded``), never silently absent.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shardbench.records import parse_json_object
from shardbench.studies.compare import GATED_METRICS, MAX_SIZE_METRICS, NOT_GATED, NOT_GATED_WHY, gated
from shardbench.studies.compare_rules import Thresholds

#: fields a line must have to be placed on a chart at all
REQUIRED = ("suite", "cell", "time")
#: the numbers a metric entry may carry; each a number or null
METRIC_FIELDS = ("value", "baseline", "low", "high")
#: known metrics first, in this order (the rest follow alphabetically)
METRIC_ORDER = (
    "peak_mem_bytes",
    "model_state_bytes",
    "held_after_step_bytes",
    "comm_sent_bytes",
    "step_time_vs_ddp",
    "step_time_s",
    "mfu",
)
#: cell verdicts the last night's table lists
ALARMS = ("regressed", "now failing")
#: a metric verdict the gate gave: the band it was judged by is the gate's
GATE_VERDICTS = ("regressed", "improved", "unchanged")
#: the history schema from which a line holds every metric ``compare`` compared, and ``dedicated``
EVERY_METRIC_SCHEMA = 2


@dataclass(frozen=True)
class Series:
    """One metric of one cell over the nights, oldest first; every tuple has one entry a night.

    ``verdicts`` are the metric's own (``regressed`` marks the night); ``cell_verdicts`` and
    ``statuses`` are the cell's, which say why a night has no value (``now failing``, ``oom``,
    ``missing``) even where the metric itself was not written that night. ``gated``: the gate
    could fail the night on this metric (``night_gated``); where it could not, the night has no
    band, and its verdict is ``not gated`` whatever the line says. ``recorded``: the night's line
    holds the metric (a line of an older shardbench may not).
    """

    cell: str
    metric: str
    unit: str | None
    times: tuple[datetime, ...]
    values: tuple[float | None, ...]
    baselines: tuple[float | None, ...]
    lows: tuple[float | None, ...]
    highs: tuple[float | None, ...]
    verdicts: tuple[str | None, ...]
    cell_verdicts: tuple[str | None, ...]
    statuses: tuple[str | None, ...]
    runs: tuple[str, ...]
    gated: tuple[bool, ...]
    recorded: tuple[bool, ...]


def read_history(path: Path) -> list[dict[str, Any]]:
    """The valid lines of a history file, in file order. A bad line warns (``file:line: ...``)
    and is skipped; a missing or unreadable file is a ``ValueError`` (a user mistake)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"history file {path} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a directory; give a history .jsonl file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read history file {path}: {getattr(e, 'strerror', None) or e}") from None
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(parse_line(line))
        except ValueError as e:
            warnings.warn(f"{path}:{lineno}: not a history line ({e}); skipped", stacklevel=2)
    return out


def parse_line(line: str) -> dict[str, Any]:
    """One JSONL line as a history entry; ``ValueError`` says what is wrong with it."""
    data = parse_json_object(line)
    missing = [k for k in REQUIRED if not isinstance(data.get(k), str) or not data[k]]
    if missing:
        raise ValueError(f"missing or empty field(s) {', '.join(missing)}")
    parse_time(data["time"])
    metrics = data.get("metrics")
    if metrics is not None and not isinstance(metrics, dict):
        raise ValueError(f"metrics must be an object, got {type(metrics).__name__}")
    for name, entry in (metrics or {}).items():
        if not isinstance(entry, dict):
            raise ValueError(f"metric {name!r} must be an object, got {type(entry).__name__}")
        for key in METRIC_FIELDS:
            v = entry.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
                raise ValueError(f"metric {name!r} {key} must be a number or null, got {v!r}")
    return data


def parse_time(text: str) -> datetime:
    """ISO 8601 as the history writes it (``2026-11-30T15:00:00+0000``); no offset means UTC,
    so naive and aware times from different writers still sort together."""
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"time {text!r} is not ISO 8601") from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def series(history: Iterable[dict[str, Any]]) -> dict[tuple[str, str], Series]:
    """``(cell, metric) -> Series``, each sorted by time, in metric then cell order.

    A cell's series covers every night of that cell, including nights where the metric is
    absent (a failed or missing cell): those have no value, and the cell's status and verdict
    say why. A line repeated for the same run and cell (a re-appended night) counts once, the
    last one written.
    """
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for i, line in enumerate(history):
        latest[(str(line.get("run_id") or f"#{i}"), line["cell"])] = line
    nights: dict[str, list[dict[str, Any]]] = {}
    for line in latest.values():
        nights.setdefault(line["cell"], []).append(line)
    out: dict[tuple[str, str], Series] = {}
    pairs = {(cell, m) for cell, lines in nights.items() for line in lines for m in line.get("metrics") or {}}
    for cell, metric in sorted(pairs, key=lambda p: (metric_key(p[1]), p[0])):
        lines = sorted(nights[cell], key=lambda line: parse_time(line["time"]))
        out[(cell, metric)] = _series(cell, metric, lines)
    return out


def night_gated(line: dict[str, Any], metric: str) -> bool:
    """Whether the gate, as it is, can fail this night's cell on ``metric``: the metric is one it
    gates on that night's runner (``compare.gated``; a line that does not say whether the runner
    was dedicated is read by the gate's default), and the night's own verdict is a gate verdict
    (not "not gated", nor "not judged": a ratio of one run)."""
    entry = (line.get("metrics") or {}).get(metric) or {}
    dedicated = line.get("dedicated", Thresholds.dedicated) is True
    return gated(metric, dedicated=dedicated) and entry.get("verdict") in GATE_VERDICTS


def _series(cell: str, metric: str, lines: Sequence[dict[str, Any]]) -> Series:
    entries = [(line.get("metrics") or {}).get(metric) or {} for line in lines]
    units = [e["unit"] for e in entries if isinstance(e.get("unit"), str)]  # the newest one wins
    judged = tuple(night_gated(line, metric) for line in lines)

    def band(values: Iterable[object]) -> tuple[float | None, ...]:
        return tuple(_number(v) if g else None for v, g in zip(values, judged, strict=True))

    def verdict(e: dict[str, Any], line: dict[str, Any], gate: bool) -> str | None:
        if e.get("verdict") in GATE_VERDICTS and not gate:
            return NOT_GATED  # an older gate's verdict on what today's does not gate
        if line.get("ignored") and e.get("verdict") == "regressed":
            return "ignored"  # a rule let the gate pass it: drawn as such, not as an alarm
        return _text(e.get("verdict"))

    return Series(
        cell=cell,
        metric=metric,
        unit=units[-1] if units else unit_of(metric),
        times=tuple(parse_time(line["time"]) for line in lines),
        values=tuple(_number(e.get("value")) for e in entries),
        baselines=tuple(_number(e.get("baseline")) for e in entries),
        lows=band(e.get("low") for e in entries),
        highs=band(e.get("high") for e in entries),
        verdicts=tuple(verdict(e, line, g) for e, line, g in zip(entries, lines, judged, strict=True)),
        gated=judged,
        recorded=tuple(metric in (line.get("metrics") or {}) for line in lines),
        cell_verdicts=tuple(
            "ignored" if line.get("ignored") and line.get("verdict") in ALARMS else _text(line.get("verdict"))
            for line in lines
        ),
        statuses=tuple(_text(line.get("status")) for line in lines),
        runs=tuple(str(line.get("name") or line.get("run_id") or "") for line in lines),
    )


def not_gated_title(metric: str) -> str:
    """What a chart of a metric the gate gated on none of its nights says of it, and why: one it
    gates was judged on none (no baseline; ``compare.NOT_JUDGED``: a ratio of one run), another it
    reports only."""
    if metric in GATED_METRICS:
        return "judged on no night (new cells, ratios of one run or too few steps): no tolerance band"
    why = NOT_GATED_WHY.get(metric, "the gate does not gate it")
    return f"reported, not gated ({why}): no tolerance band"


def unrecorded(history: Sequence[dict[str, Any]]) -> list[str]:
    """The metrics the gate gates on every runner that no line of ``history`` holds, where some
    line is of a schema before every compared metric was kept (an older shardbench's nights): a
    chart that would be missing, said instead. A max-size answer is left out (a suite without
    searches has none); so is everything where every line is of today's schema, whose cells
    simply have no such metric."""
    if all(schema_of(line) >= EVERY_METRIC_SCHEMA for line in history):
        return []
    held = {m for line in history for m in line.get("metrics") or {}}
    searches = {metric for metric, _ in MAX_SIZE_METRICS.values()}
    return [m for m in GATED_METRICS if m not in held and m not in searches]


def schema_of(line: dict[str, Any]) -> int:
    """The history schema a line was written in (1 where it does not say: the first)."""
    schema = line.get("schema")
    return schema if isinstance(schema, int) and not isinstance(schema, bool) else 1


def metric_key(metric: str) -> tuple[int, str]:
    return (METRIC_ORDER.index(metric) if metric in METRIC_ORDER else len(METRIC_ORDER), metric)


def display_unit(unit: str | None) -> tuple[str, float]:
    """(label, divisor) for charts and tables: MiB for bytes, ms for seconds, % for a fraction
    (MFU), others as they are."""
    if unit == "bytes":
        return "MiB", float(2**20)
    if unit == "s":
        return "ms", 1e-3
    if unit == "fraction":
        return "%", 1e-2
    return unit or "", 1.0


def last_night(history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lines of the most recent night (by time; the run id settles a tie), one per cell, in cell
    order (a cell written twice that night: the last line)."""
    if not history:
        return []
    newest = max(history, key=lambda line: (parse_time(line["time"]), night_of(line)))
    lines = [line for line in history if night_of(line) == night_of(newest)]
    return sorted({line["cell"]: line for line in lines}.values(), key=lambda line: line["cell"])


def night_of(line: dict[str, Any]) -> str:
    """What makes lines one night: the run id, or the time where a writer left the id out."""
    return str(line.get("run_id") or line["time"])


def alarms(lines: Iterable[dict[str, Any]]) -> list[tuple[dict[str, Any], str | None]]:
    """(line, metric) for what went wrong in these lines: each regressed metric, and a cell that
    is now failing or regressed without naming a metric (metric ``None``)."""
    out: list[tuple[dict[str, Any], str | None]] = []
    for line in lines:
        if line.get("ignored"):
            continue  # a rule let the gate pass it (the reason is in the line)
        metrics = line.get("metrics") or {}
        bad = [m for m in sorted(metrics, key=metric_key) if metrics[m].get("verdict") == "regressed"]
        out += [(line, m) for m in bad]
        if not bad and line.get("verdict") in ALARMS:
            out.append((line, None))
    return out


def _number(v: object) -> float | None:
    """A finite number, or None (JSON null, or a NaN a lenient writer let through)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _text(v: object) -> str | None:
    return v if isinstance(v, str) else None


def unit_of(metric: str, entry: dict[str, Any] | None = None) -> str | None:
    """The entry's ``unit``, or one read from the metric's name (``*_bytes``, ``*_s``)."""
    if entry and isinstance(entry.get("unit"), str):
        return entry["unit"]
    return "bytes" if metric.endswith("_bytes") else "s" if metric.endswith("_s") else None
