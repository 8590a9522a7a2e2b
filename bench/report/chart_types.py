"""The types a chart is made of (``Bar``, ``Line``, ``Panel``, ``Chart``) and the helpers that
label and order them: the plain values between records and matplotlib.

Plots are drawn from these values and tests assert on them, so "is the failed cell in the chart?"
is a question about a list, not about pixels. Everything here is pure (records in, values out) and
nothing is dropped: a failed cell becomes a bar or point with no value and its status.
"""

from __future__ import annotations

import textwrap
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from shardbench.paths import path_component
from shardbench.records import Record, strategy_label
from shardbench.report.styles import strategy_key

T = TypeVar("T")
GIB, MIB = 2**30, 2**20


@dataclass(frozen=True)
class Bar:
    group: str  # x position (the cell without its strategy)
    series: str  # strategy: colour and legend entry
    value: float | None  # in the panel's unit; None when the cell failed or measured nothing
    status: str = "ok"  # the record's status, or "no data" for an ok record without this value
    err: float | None = None
    parts: dict[str, float] | None = None  # stacked components (memory breakdown)
    predicted: float | None = None  # analytic model-state prediction, drawn beside the bar
    held_parts: dict[str, float] | None = None  # model states held after a step, stacked beside


@dataclass(frozen=True)
class Line:
    series: str  # legend label: the strategy, plus the run id when runs measured the same cell
    strategy: str  # colour key
    x: tuple[int, ...]
    y: tuple[float | None, ...]  # None: a failed point, drawn on the axis with its status
    status: tuple[str, ...]
    hollow: tuple[bool, ...]  # simulated or fake (planned) points
    dashed: bool = False  # predicted rather than measured
    upper: tuple[float | None, ...] | None = None  # bisection bound (smallest failing size)
    marker: str = "o"  # "^": activation checkpointing, so a variant of one strategy reads apart


@dataclass(frozen=True)
class Panel:
    ylabel: str
    bars: tuple[Bar, ...] = ()
    lines: tuple[Line, ...] = ()
    reference: dict[str, float] = field(default_factory=dict)  # group -> DDP's value
    title: str = ""
    xlabel: str = ""
    #: what a dashed line predicts, for the legend
    predicted: str = "model states"
    #: the dashed lines' whole legend entry where they are no prediction (ideal scaling)
    dashed_label: str = ""


@dataclass(frozen=True)
class Chart:
    kind: str  # peak_memory | breakdown | step_time | ... (a key of chart_data.ALL_CHARTS)
    name: str  # file stem, unique within a report
    title: str
    subtitle: str
    panels: tuple[Panel, ...]
    notes: tuple[str, ...] = ()


#: a preset longer than this (an ``hf:`` model's config, ``key=value:key=value...``) is too long
#: for a title or a one-line label: it is wrapped, and titles name the workload alone
PRESET_WIDTH = 32


def preset_text(preset: str, width: int = PRESET_WIDTH) -> str:
    """A preset as a label: as it is when short; a long config as ``key=value, ...`` wrapped
    at ``width`` characters, so the label is as narrow as the chart's own text."""
    if len(preset) <= width:
        return preset
    return "\n".join(textwrap.wrap(preset.replace(":", ", "), width))


def cell_title(workload: str, preset: str) -> tuple[str, str]:
    """A chart's title for one workload and preset, and a line for its subtitle: a long preset
    goes to the subtitle (``preset: key=value, ...``, wrapped with it), not into the title,
    which would stretch the figure and shrink all of its text."""
    if len(preset) <= PRESET_WIDTH:
        return f"{workload}/{preset}", ""
    return workload, "preset: " + preset.replace(":", ", ")


def is_summary(r: Record) -> bool:
    """Max-size summary records describe a search, not a measured cell."""
    return r.suite == "max-size" or r.max_size is not None


def mem_unit(values: Sequence[float | None]) -> tuple[str, int]:
    """GiB for model-scale numbers, MiB when everything would read as 0.0x GiB."""
    top = max((v for v in values if v is not None), default=0)
    return ("GiB", GIB) if top >= GIB / 2 else ("MiB", MIB)


def slug(*parts: object) -> str:
    """A file name made of ``parts`` (``shardbench.paths.path_component``: safe, and a long one, such
    as an ``hf:`` preset of many keys, shortened with a hash of the whole)."""
    text = "-".join(str(p) for p in parts if p not in (None, ""))
    return path_component(text or "_", what="file name", separators="replace")


#: how a record was measured, as (flag, label): in subtitles, and in the label of each cell
#: it applies to, so cells that differ only in them never share a bar or a legend entry
FLAGS: tuple[tuple[Callable[[Record], bool], str], ...] = (
    (lambda r: r.simulated, "simulated"),
    (lambda r: r.fake, "fake (planned)"),
    (lambda r: r.activation_checkpointing, "AC"),
)


def subtitle(records: Sequence[Record]) -> str:
    """Where and how the numbers were taken: device, precision, simulated/fake/AC, runs."""
    devices = sorted({f"{r.device} ({r.env.get('device_name') or '?'})" for r in records})
    parts = [", ".join(devices), "/".join(sorted({r.precision for r in records}))]
    for flag, label in FLAGS:
        n = sum(1 for r in records if flag(r))
        if n:
            parts.append(label if n == len(records) else f"{n} of {len(records)} cells {label}")
    runs = sorted({r.run_id for r in records})
    parts.append(f"run {runs[0]}" if len(runs) == 1 else f"{len(runs)} runs merged")
    return " · ".join(parts)


def flag_notes(records: Sequence[Record]) -> list[str]:
    notes = []
    if any(r.simulated for r in records):
        notes.append("simulated: one process as rank 0 of a fake world of N; real memory, no communication.")
    if any(r.fake for r in records):
        notes.append("fake (planned): sized under FakeTensorMode; nothing was allocated.")
    if any(r.activation_checkpointing for r in records):
        notes.append(
            "AC: activation checkpointing; each block's activations are recomputed in backward "
            "(less activation memory, more compute)."
        )
    return notes


def cells(records: Sequence[Record]) -> list[Record]:
    """Measured cells, in a stable reading order. A max-size search's probes are left out: a
    search over a size family probes a dozen shapes per strategy, which would crowd every
    memory chart with one-off presets; the max-size chart shows the answer with its bracket,
    and the tables keep every probe."""
    return sorted(
        (r for r in records if not is_summary(r) and r.suite != "max-size-probe"), key=reading_order
    )


def reading_order(r: Record) -> tuple:
    return (
        r.workload, r.params, r.preset, r.world_size, r.simulated, r.fake, r.activation_checkpointing,
        r.precision, r.device, r.batch_size_per_rank, r.run_id, strategy_key(strategy_label(r)),
    )  # fmt: skip


def by_key(items: Iterable[T], key: Callable[[T], Hashable]) -> list[tuple[Any, list[T]]]:
    """Items grouped by key, groups in order of first appearance (the reading order is kept)."""
    out: dict[Any, list[T]] = defaultdict(list)
    for item in items:
        out[key(item)].append(item)
    return list(out.items())


def group_labels(records: Sequence[Record]) -> list[str]:
    """The x label of each record's cell (preset, and what else varies), without its strategy.

    Where one strategy (at one shard width) appears twice under a label (several runs measured
    the same cell), that label is split by run id so the runs stand side by side instead of
    hiding each other.
    """
    vary = {a for a in ("world_size", "precision", "device", "batch_size_per_rank") if _varies(records, a)}
    labels = [_label(r, vary) for r in records]
    for label, idxs in by_key(range(len(records)), lambda i: labels[i]):
        strategies = [strategy_label(records[i]) for i in idxs]
        if len(set(strategies)) < len(strategies):
            for i in idxs:
                labels[i] = f"{label}\n{records[i].run_id}"
    seen: Counter[tuple[str, str]] = Counter()
    for i, r in enumerate(records):  # the same run repeated a cell: keep both, numbered
        seen[(labels[i], strategy_label(r))] += 1
        if seen[(labels[i], strategy_label(r))] > 1:
            labels[i] += f" #{seen[(labels[i], strategy_label(r))]}"
    return labels


def _varies(records: Sequence[Record], attr: str) -> bool:
    return len({getattr(r, attr) for r in records}) > 1


def _label(r: Record, vary: set[str]) -> str:
    head = [preset_text(r.preset)]
    if "world_size" in vary:
        head.append(f"N={r.world_size}")
    if "precision" in vary:
        head.append(r.precision)
    if "device" in vary:
        head.append(r.device)
    if "batch_size_per_rank" in vary:
        head.append(f"b={r.batch_size_per_rank}")
    flags = [name for on, name in FLAGS if on(r)]
    return "\n".join([" ".join(head), *flags])


def series_labels(records: Sequence[Record]) -> list[str]:
    """Line labels for x = world size: the strategy (with its shard width, and ``+AC`` with
    activation checkpointing, each a line of its own), plus the run id where runs share a point."""
    names = [f"{strategy_label(r)}+AC" if r.activation_checkpointing else strategy_label(r) for r in records]
    dup = {s for s, idx in by_key(range(len(records)), lambda i: names[i])
           if len({records[i].world_size for i in idx}) < len(idx)}  # fmt: skip
    return [f"{n} [{r.run_id}]" if n in dup else n for n, r in zip(names, records, strict=True)]


def status_of(r: Record, value: float | None) -> str:
    return r.status if r.status != "ok" else ("ok" if value is not None else "no data")
