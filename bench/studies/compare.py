"""Compare a run against a baseline, cell by cell: the regression gate's decision, as a pure
function of two lists of records and the rules (``compare_runs``).

Memory and time are gated differently because they fail differently. Memory is deterministic
for a fixed environment (the same cell twice gives the same bytes), so its tolerance is tight:
``max(0.5%, 1 MiB)`` by default; bytes communicated are gated exactly. Step time is noisy, and on
a shared machine it drifts between runs, so by default it is gated as each strategy's ratio to
ddp's within its run (``compare_ratios``: the cells of a group are measured interleaved, so a
drift hits both sides alike). Absolute step time is gated only where the rules declare the
runner dedicated, and only with ``min_repeats`` timed repeats on each side; elsewhere it is
reported as "not gated". Either time gate calls a change slower only beyond *both* a relative
threshold (per device: CPU 15%, CUDA 5%) *and* k=3 times the combined noise of the two sides
(absolute: the step-time MAD, or with ``run --repeat`` the larger of the repeats' median MAD and
the MAD of their medians; ratios: a standard error, see ``compare_ratios``). A change within
those bounds is "unchanged" whatever its sign. Cells with fewer than ``min_steps`` timed steps
are compared for memory only. A ratio that ``run`` would not judge faster or slower is "not
judged" here, and cannot fail the gate (``compare_ratios.not_judged``, the one rule for both): one
pair with ddp on a side (a run without repeats) cannot tell a change from the drift between its
two cells, nor can a cell whose ranks waited for a core.

Verdicts per cell: ``regressed``, ``improved``, ``unchanged``, ``new`` (only in the current run),
``missing`` (only in the baseline), ``now failing`` (ok in the baseline, not now), ``now
passing``. A regression (exit 1) is a cell that is ``now failing`` or a metric ``regressed``,
unless a rule ignores it (the reason is shown). ``missing`` fails only where the suite is fixed
(``nightly``: a lost measurement); comparing two arbitrary runs, it is a suite edit.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from shardbench.core_binding import RUN_FREE
from shardbench.records import CellKey, Record
from shardbench.studies.compare_ratios import (
    RATIO_METRIC,
    Ratio,
    cell_ratios,
    not_judged,
    pair_spread,
    pooled_error,
    ratio_band,
)
from shardbench.studies.compare_rules import CELL_FIELDS, Rules, Thresholds
from shardbench.studies.compare_strategy import CellChange, StrategyDelta, strategy_deltas
from shardbench.studies.machines import env_changes, for_machine
from shardbench.studies.provenance import Provenance, what_changed
from shardbench.studies.reference import REFERENCE
from shardbench.wording import count

#: what makes two records the same cell (the device's name comes from the record's env)
IDENTITY = CELL_FIELDS
#: peak of the highest rank; model states after a step (params + grads + optimizer); and all
#: memory held between steps (``model_state_bytes["held"]``: model states plus what a strategy
#: keeps beside them, e.g. DDP's gradient buckets), which catches a persistent extra buffer that
#: a peak sitting mid-backward hides
MEMORY_METRICS = ("peak_mem_bytes", "model_state_bytes", "held_after_step_bytes")
TIME_METRIC = "step_time_s"
#: bytes a rank sends per step (``Record.comm_per_step``): deterministic, so gated exactly
COMM_METRIC = "comm_sent_bytes"
#: model FLOPs utilisation (``Record.mfu``): reported beside the step time, never gated. It is
#: the FLOPs per step over the absolute step time, so it drifts with it on a shared runner, and
#: on a dedicated one the time's own gate already judges the same speed
MFU_METRIC = "mfu"
#: a max-size search's answer (``max-size`` summary records): the largest model (or per-rank
#: batch) that trained in the budget. It moves in discrete steps, so any decrease regresses.
MAX_SIZE_METRICS = {
    "params": ("max_trainable_params", "params"),
    "batch": ("max_trainable_batch", "batch_size"),
}
VERDICTS = ("regressed", "now failing", "improved", "now passing", "new", "missing", "unchanged")
#: a metric's verdict where the gate reports it and counts it for nothing: absolute step time on
#: a shared runner, MFU; and a ratio too uncertain to judge (``compare_ratios.not_judged``)
NOT_GATED, NOT_JUDGED = "not gated", "not judged"
#: what the gate can fail a cell on, on every runner; absolute step time too on a dedicated one
#: (``gated``); anything else (MFU) it reports only
GATED_METRICS = (
    *MEMORY_METRICS,
    COMM_METRIC,
    RATIO_METRIC,
    *(metric for metric, _ in MAX_SIZE_METRICS.values()),
)
#: why a metric the gate reports is not gated, in words
NOT_GATED_WHY = {
    TIME_METRIC: "absolute time drifts between runs on a shared runner; its ratio to ddp is gated",
    MFU_METRIC: (
        f"the FLOPs per step over the absolute step time, which drifts on a shared runner; speed is "
        f"gated as the step time's ratio to {REFERENCE} (and as the time itself on a dedicated runner)"
    ),
}


def gated(metric: str, *, dedicated: bool) -> bool:
    """Whether the gate can fail a cell on ``metric``: memory, bytes sent, the step-time ratio
    and a max-size answer everywhere; absolute step time only where the rules declare the runner
    ``dedicated``; nothing else."""
    return metric in GATED_METRICS or (metric == TIME_METRIC and dedicated)


def _what_differs(baseline: set[tuple[Any, ...]], current: set[tuple[Any, ...]]) -> str:
    """The identity fields whose values the two sides do not share, e.g. ``batch 8 in the
    baseline, 16 now``: why no cell matches."""
    parts = []
    for i, name in enumerate(IDENTITY):
        before, now = {k[i] for k in baseline}, {k[i] for k in current}
        if before != now:
            show = lambda values: ", ".join(sorted(map(str, values)))  # noqa: E731
            parts.append(f"{name} {show(before)} in the baseline, {show(now)} now")
    return "; ".join(parts) or "the same fields, never in the same combination"


def identity(r: Record) -> CellKey:
    """The cell a record measures, as every comparison of cells names it (``CellKey.of``)."""
    return CellKey.of(r)


def cell_label(key: tuple[Any, ...]) -> str:
    """A short stable name: workload/preset/strategy/nN/[sS/]precision/bB/device[/sim|/fake][/ac]
    (``/ac``: activation checkpointing, ``sS``: a shard width other than N; a cell without them
    keeps the name it always had)."""
    fields = dict(zip(IDENTITY, key, strict=True))
    mode = "/fake" if fields["fake"] else "/sim" if fields["simulated"] else ""
    mode += "/ac" if fields["activation_checkpointing"] else ""
    batch = "" if fields["batch_size"] is None else f"/b{fields['batch_size']}"
    shards = "" if fields.get("shard_group") is None else f"s{fields['shard_group']}/"
    return (
        f"{fields['workload']}/{fields['preset']}/{fields['strategy']}/n{fields['world_size']}/{shards}"
        f"{fields['precision']}{batch}/{fields['device']}{mode}"
    )


@dataclass(frozen=True)
class Side:
    """One side's view of a cell, its repeats combined."""

    status: str
    repeats: int
    memory: dict[str, int | None]
    #: median step time (median of the repeats' medians), its noise, and the fewest timed steps
    time_s: float | None = None
    noise_s: float | None = None
    steps: int = 0
    #: memory differed between repeats of the same cell (it should not; the larger is used)
    memory_varied: tuple[str, ...] = ()
    #: by how much: the largest less the smallest, per memory metric that varied
    memory_spread: dict[str, int] = field(default_factory=dict)
    #: a max-size summary's answer: (metric, largest that fitted; 0 when nothing did)
    max_size: tuple[str, int] | None = None
    #: bytes sent per rank per step (the largest, if repeats differed: they should not)
    comm: int | None = None
    #: ok repeats with a step time (what a dedicated runner's absolute gate counts)
    timed: int = 0
    #: step time over the group's ddp's, pair by pair (None: ddp itself, or no ddp to pair with)
    ratio: Ratio | None = None
    #: MFU, the median of the repeats' (None where no repeat has one)
    mfu: float | None = None


@dataclass
class MetricDelta:
    metric: str
    unit: str
    baseline: float | None
    current: float | None
    verdict: str
    #: the band around the baseline inside which the metric is "unchanged"
    low: float | None = None
    high: float | None = None
    note: str = ""
    #: the change's standard error, in the metric's unit (the step-time ratio's; else None)
    error: float | None = None

    @property
    def change_pct(self) -> float | None:
        if self.baseline in (None, 0) or self.current is None:
            return None
        return 100.0 * (self.current - self.baseline) / self.baseline


@dataclass
class CellDelta:
    cell: str
    identity: dict[str, Any]
    verdict: str
    baseline_status: str | None
    current_status: str | None
    metrics: list[MetricDelta] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: why a rule ignores this cell's regression ("" when none does)
    ignored: str = ""
    #: a ``missing`` cell counts as a regression (``nightly``)
    missing_fails: bool = False

    @property
    def regressed(self) -> bool:
        failing = (
            ("regressed", "now failing", "missing") if self.missing_fails else ("regressed", "now failing")
        )
        return self.verdict in failing and not self.ignored


@dataclass
class Comparison:
    cells: list[CellDelta]
    #: {key: (baseline values, current values)} for every environment fact that differs
    env_changes: dict[str, tuple[list[Any], list[Any]]]
    rules_source: str = "defaults"
    #: rules whose ``match`` selects no cell of either run (a typo, most likely), described
    unmatched_rules: list[str] = field(default_factory=list)
    #: the rules declare the runner dedicated: absolute step time is gated too
    dedicated: bool = False
    #: each strategy's step-time ratio to ddp over all its cells of a device (``compare_strategy``)
    strategies: list[StrategyDelta] = field(default_factory=list)
    #: what changed between the sides: commits, versions, machine (``provenance.what_changed``)
    provenance: Provenance | None = None

    @property
    def regressions(self) -> list[CellDelta]:
        return [c for c in self.cells if c.regressed]

    @property
    def strategy_regressions(self) -> list[StrategyDelta]:
        return [s for s in self.strategies if s.regressed]

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions or self.strategy_regressions else 0

    def counts(self) -> dict[str, int]:
        """Cells per verdict; a regression a rule ignores counts as ``ignored``, not regressed."""
        out = dict.fromkeys((*VERDICTS, "ignored"), 0)
        for c in self.cells:
            out["ignored" if c.ignored and c.verdict in ("regressed", "now failing") else c.verdict] += 1
        return out


class EnvironmentChanged(ValueError):
    """The two sides ran on different software or hardware; their numbers do not compare."""


class NothingInCommon(ValueError):
    """The two sides share no cell: every row would be new or missing, and nothing compared."""


def compare_runs(
    baseline: Sequence[Record],
    current: Sequence[Record],
    rules: Rules | None = None,
    *,
    allow_env_change: bool = False,
    missing_fails: bool = False,
) -> Comparison:
    """Every cell of either side with its verdict and per-metric deltas, regressions first.

    A baseline of several machines is read as the one of ``current``'s (``machines.for_machine``).
    Raises ``EnvironmentChanged`` when torch, the device, the record schema or the ranks'
    binding to cores differ between the sides (``machines.ENV_KEYS``), unless
    ``allow_env_change`` (then every row carries a note saying so), and ``NothingInCommon``
    when no cell is on both sides (the wrong baseline, most likely).
    ``missing_fails``: a baseline cell absent now is a regression (``nightly``: the suite is
    fixed, so a missing cell is a lost measurement, not a suite edit)."""
    rules = rules or Rules()
    baseline = for_machine(baseline, current)
    changes = env_changes(baseline, current)
    if changes and not allow_env_change:
        _refuse_env_changes(changes)
    base_cells, cur_cells = _by_cell(baseline), _by_cell(current)
    if base_cells and cur_cells and not set(base_cells) & set(cur_cells):
        _refuse_nothing_in_common(base_cells, cur_cells)
    spread, spreads = _pair_spreads(base_cells, cur_cells)
    cells, changes_of_ratios = [], []
    for key in sorted(set(base_cells) | set(cur_cells), key=str):
        fields = dict(zip(IDENTITY, key, strict=True))
        thresholds = rules.thresholds_for(fields)
        delta = _compare_cell(
            key, base_cells.get(key), cur_cells.get(key), thresholds, spread=spread, spreads=spreads
        )
        if not rules.ignored_reason(fields, {RATIO_METRIC}):
            b, c = base_cells.get(key), cur_cells.get(key)
            pair = (b.ratio, c.ratio) if b and c and b.ratio and c.ratio else None
            changes_of_ratios += _ratio_changes(delta, thresholds, pair)
        delta.missing_fails = missing_fails
        regressed = {m.metric for m in delta.metrics if m.verdict == "regressed"}
        delta.ignored = rules.ignored_reason(fields, regressed if delta.verdict == "regressed" else None)
        delta.notes += [f"threshold override: {reason}" for reason in rules.override_reasons(fields)]
        if changes:
            delta.notes.append("environment changed: " + ", ".join(changes))
        cells.append(delta)
    cells.sort(key=lambda c: (not c.regressed, VERDICTS.index(c.verdict), c.cell))
    every = [dict(zip(IDENTITY, key, strict=True)) for key in set(base_cells) | set(cur_cells)]
    return Comparison(
        cells=cells,
        env_changes=changes,
        rules_source=rules.source,
        unmatched_rules=rules.unmatched(every),
        dedicated=rules.dedicated,
        strategies=strategy_deltas(changes_of_ratios),
        provenance=what_changed(baseline, current),
    )


def _refuse_env_changes(changes: dict[str, tuple[list, list]]) -> None:
    """Raise ``EnvironmentChanged`` listing how the sides' environments differ."""
    listed = "; ".join(f"{k}: {b} -> {c}" for k, (b, c) in changes.items())
    free = f" ({RUN_FREE}, as unbound records were)"
    raise EnvironmentChanged(
        f"the runs differ in environment ({listed}); their numbers do not compare. "
        "Save a new baseline on this environment, or pass --allow-env-change to compare anyway"
        + (free if "rank_binding" in changes else "")
    )


def _refuse_nothing_in_common(base_cells: dict[tuple, Side], cur_cells: dict[tuple, Side]) -> None:
    """Raise ``NothingInCommon`` saying how the two sides' cells differ."""
    raise NothingInCommon(
        f"no cell is in both runs ({len(base_cells)} in the baseline, {len(cur_cells)} now): "
        f"{_what_differs(set(base_cells), set(cur_cells))}; is it the right baseline?"
    )


def _pair_spreads(
    base_cells: dict[tuple, Side], cur_cells: dict[tuple, Side]
) -> tuple[float, tuple[float, float]]:
    """The pairs' relative spread over the whole comparison (``pair_spread``), and each side's
    own (the baseline's, the current run's) for the strategy-wide test: a side whose run has
    only one pair has none of its own, and takes the comparison's."""
    spread = pair_spread(
        side.ratio for sides in (base_cells, cur_cells) for side in sides.values() if side.ratio is not None
    )
    spreads = tuple(
        pair_spread(side.ratio for side in sides.values() if side.ratio is not None) or spread
        for sides in (base_cells, cur_cells)
    )
    return spread, spreads


def _ratio_changes(delta: CellDelta, t: Thresholds, ratios: tuple[Ratio, Ratio] | None) -> list[CellChange]:
    """The cell's step-time ratio change, for the strategy-wide test (none without one)."""
    if ratios is None:
        return []
    return [
        CellChange(
            strategy=delta.identity["strategy"],
            device=delta.identity["device"],
            cell=delta.cell,
            log_change=math.log(m.current / m.baseline),
            error=m.error / m.baseline,
            base_runs=ratios[0].run_logs(),
            cur_runs=ratios[1].run_logs(),
            pct=t.strategy_pct,
            k=t.k_mad,
        )
        for m in delta.metrics
        if m.metric == RATIO_METRIC and m.error is not None and m.baseline and m.current
    ]


def _by_cell(records: Sequence[Record]) -> dict[tuple, Side]:
    """Records grouped by cell, one per run and repeat: when a run recorded a repeat twice (a
    resumed run's ``interrupted`` record, then its ``ok`` one) the later record is the
    measurement. Records of several runs (a baseline saved from several nights) are all repeats,
    so the spread between runs is part of the noise the time rule allows."""
    latest: dict[tuple, Record] = {}
    for r in records:
        if r.suite == "max-size-probe":
            continue  # the search's steps; its summary record carries the answer
        latest[(identity(r), r.run_id, r.repeat)] = r
    groups: dict[tuple, list[Record]] = defaultdict(list)
    for (key, _, _), r in latest.items():
        groups[key].append(r)
    ratios = cell_ratios(groups)
    return {key: replace(_side(rs), ratio=ratios.get(key)) for key, rs in groups.items()}


def _side(records: list[Record]) -> Side:
    """Repeats of one cell as one side: failed if any repeat failed (a flaky cell is a failing
    cell), memory the largest seen, time the median of the repeats' medians."""
    failed = [r.status for r in records if r.status != "ok"]
    if records[0].max_size is not None:
        metric, field_ = MAX_SIZE_METRICS.get(records[0].max_size.get("vary"), MAX_SIZE_METRICS["params"])
        # "oom" means nothing fitted: an answer (0), not a failed measurement
        fits = [((r.max_size or {}).get("largest_fit") or {}).get(field_) or 0 for r in records]
        status = next((s for s in failed if s != "oom"), "ok")
        return Side(status, len(records), {}, max_size=(metric, min(fits)))
    memory: dict[str, int | None] = {}
    varied, spread = [], {}
    for metric in MEMORY_METRICS:
        values = {_memory(r, metric) for r in records} - {None}
        memory[metric] = max(values) if values else None
        if len(values) > 1:
            varied.append(metric)
            spread[metric] = max(values) - min(values)
    sent = {s for r in records if (s := (r.comm_per_step or {}).get("sent_per_rank")) is not None}
    comm = max(sent) if sent else None
    if len(sent) > 1:
        varied.append(COMM_METRIC)
    timed = [r.step_time_s for r in records if r.status == "ok" and r.step_time_s]
    timed = [t for t in timed if t.get("median") is not None]
    if not timed:
        return Side(
            failed[0] if failed else "ok",
            len(records),
            memory,
            memory_varied=tuple(varied),
            memory_spread=spread,
            comm=comm,
        )
    medians = [t["median"] for t in timed]
    mfus = [r.mfu for r in records if r.status == "ok" and r.mfu is not None]
    noise = statistics.median(t.get("mad") or 0.0 for t in timed)
    if len(medians) > 1:
        centre = statistics.median(medians)
        noise = max(noise, statistics.median(abs(m - centre) for m in medians))
    return Side(
        status=failed[0] if failed else "ok",
        repeats=len(records),
        memory=memory,
        time_s=statistics.median(medians),
        noise_s=noise,
        steps=min(int(t.get("n") or 0) for t in timed),
        memory_varied=tuple(varied),
        memory_spread=spread,
        comm=comm,
        timed=len(timed),
        mfu=statistics.median(mfus) if mfus else None,
    )


def _memory(r: Record, metric: str) -> int | None:
    if metric == "peak_mem_bytes":
        return (r.peak_mem_bytes or {}).get("max")
    return (r.model_state_bytes or {}).get("held" if metric == "held_after_step_bytes" else "total")


def _compare_cell(
    key: tuple,
    base: Side | None,
    cur: Side | None,
    t: Thresholds,
    *,
    spread: float = 0.0,
    spreads: tuple[float, float] = (0.0, 0.0),
) -> CellDelta:
    """``spread``: the pairs' relative spread over the whole comparison (``pair_spread``);
    ``spreads``: each side's own (the baseline's, the current run's)."""
    delta = CellDelta(
        cell=cell_label(key),
        identity=dict(zip(IDENTITY, key, strict=True)),
        verdict="unchanged",
        baseline_status=base.status if base else None,
        current_status=cur.status if cur else None,
    )
    if base is None or cur is None:
        delta.verdict = "new" if base is None else "missing"
        side = cur or base
        assert side is not None
        delta.metrics = [
            MetricDelta(m, "bytes", None if base is None else v, None if cur is None else v, delta.verdict)
            for m, v in side.memory.items()
        ]
        return delta
    if base.status == "ok" and cur.status != "ok":
        delta.verdict = "now failing"
        delta.notes.append(f"was ok, now {cur.status}")
        return delta
    if base.status != "ok" and cur.status == "ok":
        delta.verdict = "now passing"
        delta.notes.append(f"was {base.status}, now ok")
        return delta
    if base.status != "ok":
        delta.notes.append(f"failing on both sides ({base.status} -> {cur.status})")
        return delta
    if base.max_size is not None and cur.max_size is not None:
        delta.metrics = [_max_size_delta(base.max_size[0], base.max_size[1], cur.max_size[1])]
        delta.verdict = delta.metrics[0].verdict
        return delta
    return _compare_measured(delta, base, cur, t, spread=spread, spreads=spreads)


def _compare_measured(
    delta: CellDelta,
    base: Side,
    cur: Side,
    t: Thresholds,
    *,
    spread: float,
    spreads: tuple[float, float],
) -> CellDelta:
    """``delta`` of a cell measured ok on both sides: its memory, bytes sent, time, step-time
    ratio and MFU compared; regressed where any metric regressed, else improved where any
    improved."""
    for side, name in ((base, "baseline"), (cur, "current")):
        if side.memory_varied:
            delta.notes.append(f"{name}: {', '.join(side.memory_varied)} differed between repeats")
    delta.metrics = [
        _memory_delta(m, base.memory[m], cur.memory[m], t, spread=base.memory_spread.get(m, 0))
        for m in MEMORY_METRICS
        if base.memory[m] is not None or cur.memory[m] is not None
    ]
    if base.comm is not None and cur.comm is not None:
        delta.metrics.append(_comm_delta(base.comm, cur.comm))
    time = _time_delta(base, cur, t, reference=delta.identity["strategy"] == REFERENCE)
    if time is not None:
        delta.metrics.append(time)
        ratio = _ratio_delta(base, cur, t, spread=spread, spreads=spreads)
        delta.metrics += [ratio] if ratio is not None else []
    else:
        delta.notes.append(f"fewer than {count(t.min_steps, 'timed step')}: compared for memory only")
    if base.mfu is not None or cur.mfu is not None:
        note = _mfu_note(delta.metrics)
        delta.metrics.append(MetricDelta(MFU_METRIC, "fraction", base.mfu, cur.mfu, NOT_GATED, note=note))
    verdicts = {m.verdict for m in delta.metrics}
    delta.verdict = next((v for v in ("regressed", "improved") if v in verdicts), "unchanged")
    return delta


def _memory_delta(
    metric: str, base: int | None, cur: int | None, t: Thresholds, *, spread: int = 0
) -> MetricDelta:
    """``base``: the largest of the baseline's repeats; ``spread``: how far they varied, which
    widens the tolerance (memory of a deterministic strategy never varies)."""
    if base is None or cur is None:
        return MetricDelta(metric, "bytes", base, cur, "unchanged", note="not measured on both sides")
    tolerance = max(t.memory_pct / 100.0 * base, t.memory_bytes, spread)
    note = (
        f"tolerance: the baseline's repeats varied by {spread:,} B" if spread and tolerance == spread else ""
    )
    return MetricDelta(
        metric,
        "bytes",
        base,
        cur,
        _verdict(cur - base, tolerance),
        low=base - tolerance,
        high=base + tolerance,
        note=note,
    )


def _time_delta(base: Side, cur: Side, t: Thresholds, *, reference: bool) -> MetricDelta | None:
    """Absolute step time: gated on a dedicated runner with enough repeats, else reported."""
    if base.time_s is None or cur.time_s is None or min(base.steps, cur.steps) < t.min_steps:
        return None
    if not t.dedicated or min(base.timed, cur.timed) < t.min_repeats:
        note = _not_gated(base, cur, t, reference=reference)
        return MetricDelta(TIME_METRIC, "s", base.time_s, cur.time_s, NOT_GATED, note=note)
    relative = t.time_pct / 100.0 * base.time_s
    noise = t.k_mad * math.hypot(base.noise_s or 0.0, cur.noise_s or 0.0)
    bound = max(relative, noise)
    which = "relative threshold" if relative >= noise else f"{t.k_mad:g} x combined MAD"
    return MetricDelta(
        TIME_METRIC,
        "s",
        base.time_s,
        cur.time_s,
        _verdict(cur.time_s - base.time_s, bound),
        low=base.time_s - bound,
        high=base.time_s + bound,
        note=f"band +/-{_ms(bound)} ({which}; {t.time_pct:g}% = {_ms(relative)}, noise {_ms(noise)})",
    )


def _not_gated(base: Side, cur: Side, t: Thresholds, *, reference: bool) -> str:
    """Why absolute step time is only reported, and what gates this cell's speed instead."""
    if t.dedicated:
        why = (
            f"not gated: {count(base.timed, 'timed repeat')} in the baseline, {cur.timed} now; absolute "
            f"time needs {t.min_repeats} on each side"
        )
    else:
        why = "not gated (shared runner): absolute time drifts between runs"
    if base.ratio is not None and cur.ratio is not None:
        return f"{why}; its ratio to {REFERENCE} is gated"
    if reference:
        return f"{why}; the reference of its group's ratios"
    return f"{why}; no {REFERENCE} of its group on both sides to gate a ratio against"


def _mfu_note(metrics: Sequence[MetricDelta]) -> str:
    """Why MFU is not gated, and what gates this cell's speed instead: the step-time rows as
    they were judged, so the MFU row never claims a gate the step time's own row denies."""
    judged = {m.metric for m in metrics if m.verdict not in (NOT_GATED, NOT_JUDGED)}
    gates = [
        what
        for metric, what in (
            (RATIO_METRIC, f"its step time's ratio to {REFERENCE}"),
            (TIME_METRIC, "its step time"),
        )
        if metric in judged
    ]
    if gates:
        speed = f"this cell's speed is gated as {' and as '.join(gates)}"
    else:
        timed = any(m.metric == TIME_METRIC for m in metrics)
        speed = "nothing gates this cell's speed" + (f" (its {TIME_METRIC} row says why)" if timed else "")
    return f"reported, not gated: MFU is the FLOPs per step over the step time; {speed}"


def _ratio_delta(
    base: Side, cur: Side, t: Thresholds, *, spread: float, spreads: tuple[float, float]
) -> MetricDelta | None:
    """Step time over the group's ddp's in the same run: baseline ratio against current ratio;
    "not judged" where either side's ratio is one ``run`` would not judge (``not_judged``)."""
    b, c = base.ratio, cur.ratio
    if b is None or c is None:
        return None
    skipped = [
        (side, s)
        for side, r in (("the baseline", b), ("now", c))
        if (s := not_judged(r, min_steps=t.min_steps))
    ]
    if skipped:
        why = "; ".join(f"{s.reason} {side} ({s.why})" for side, s in skipped)
        return MetricDelta(RATIO_METRIC, "x", b.value, c.value, NOT_JUDGED, note=f"not judged: {why}")
    bound, relative, noise = ratio_band(b, c, k=t.k_mad, pct=t.time_pct, spread=spread)
    which = "relative threshold" if relative >= noise else f"{t.k_mad:g} x combined standard error"
    return MetricDelta(
        RATIO_METRIC,
        "x",
        b.value,
        c.value,
        _verdict(c.value - b.value, bound),
        low=b.value - bound,
        high=b.value + bound,
        note=(
            f"band +/-{bound:.3f}x ({which}; {t.time_pct:g}% = {relative:.3f}x, noise {noise:.3f}x); "
            f"{count(b.pairs, 'pair')} with {REFERENCE} in the baseline, {c.pairs} now"
        ),
        error=pooled_error(b, c, spreads=spreads) * b.value,
    )


def _comm_delta(base: int, cur: int) -> MetricDelta:
    """Bytes communicated are deterministic: any change, up or down, is a change in what the
    strategy does (a collective added, dropped or resized) and fails the gate until a new
    baseline accepts it."""
    verdict = "unchanged" if base == cur else "regressed"
    note = "" if base == cur else "what a step communicates changed: gated exactly, either way"
    return MetricDelta(COMM_METRIC, "bytes", base, cur, verdict, low=base, high=base, note=note)


def _max_size_delta(metric: str, base: int, cur: int) -> MetricDelta:
    """Higher is better and the steps are discrete: any step down regressed, any up improved."""
    verdict = "unchanged" if base == cur else "regressed" if cur < base else "improved"
    unit = "params" if metric == "max_trainable_params" else "samples"
    return MetricDelta(metric, unit, base, cur, verdict, low=base, high=base)


def _verdict(difference: float, tolerance: float) -> str:
    if difference > tolerance:
        return "regressed"
    if difference < -tolerance:
        return "improved"
    return "unchanged"


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.1f} ms" if ms >= 10 else f"{ms:.3f} ms"
