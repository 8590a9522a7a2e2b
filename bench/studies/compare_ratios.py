"""Step time as ratios within a run: each strategy's step time over ddp's in the same cell group
(the same workload, preset, world size, precision, batch and flags), baseline ratio against
current ratio. This is how ``compare`` gates speed on a machine it does not own.

The idea: a shared or drifting machine's speed moves between runs (the same code, minutes
apart, measured 38-119 % slower), so absolute step times of two runs do not compare; but the
cells of a group are measured interleaved within a run (``harness.runner.interleave_repeats``:
ddp, zero2, ..., then ddp, zero2, ... again), so a drift hits both sides of a ratio alike.

A ratio is formed per *pair*: a cell's record and its group's ddp record of the same run and
repeat. A side's ratio is the median of its pairs'. How far two sides' ratios may differ by
chance is a standard error, the largest of three: the spread of the pairs within a run (each
pair's distance from its run's ratio, relative to it, their MAD scaled to a standard deviation:
pooled over every cell of both sides, since the spread is the machine's and a cell's two pairs
that happen to agree say little; and each side's own where it is larger, since two that
disagree say much) or each pair's own error (the steps' MAD of both cells, as the standard error
of a median of n steps), either over the square root of a side's pairs; and the spread between
runs (a baseline saved from several runs: the standard deviation of their ratios, over the
square root of each side's runs), since a run can sit in one mode as a whole. ``compare``
allows ``k`` times the two sides' combined error, and never less than the relative threshold.

Some ratios are judged by neither ``run`` nor ``compare`` (``not_judged``, the one rule both
follow): a ratio of one pair (one run without repeats) holds the drift between its two cells
and nothing to measure it by, so a 2x move from one pair is as likely the machine as the code; a
cell with too few timed steps has no median to speak of; and a cell whose ranks outnumbered the
cores (or devices) they ran on measured the wait for its turn.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardbench.records import CellKey, Record, oversubscription
from shardbench.studies.compare_rules import RATIO_METRIC
from shardbench.studies.reference import REFERENCE, step_time_ratio
from shardbench.wording import count

__all__ = [
    "MIN_PAIRS",
    "ONE_RUN",
    "RATIO_METRIC",
    "NotJudged",
    "Ratio",
    "cell_ratios",
    "group_of",
    "not_judged",
    "pair_spread",
    "pairs_of",
    "pooled_error",
    "ratio_band",
    "ratio_noise",
    "ratio_of",
]
#: MAD -> standard deviation of a normal sample
_MAD_TO_SD = 1.4826
#: standard deviation -> standard error of a median, times sqrt(n)
_SD_TO_MEDIAN_SE = 1.2533
#: the fewest pairs a ratio is judged from: one pair cannot tell a change from drift between
#: its two cells, which only the spread of several pairs (or runs) measures
MIN_PAIRS = 2
#: why a ratio of fewer pairs is not judged
ONE_RUN = "one run"


@dataclass(frozen=True)
class Ratio:
    """One side's ratio of a cell to its group's ddp: one value and one error per pair."""

    ratios: tuple[float, ...]
    #: each pair's own error: its two medians' standard errors, combined
    errors: tuple[float, ...]
    #: the fewest timed steps of any record in a pair
    steps: int
    #: each pair's run
    runs: tuple[str, ...] = ()
    #: why some pair's ranks waited for their turn ("more ranks than cores"); "" where none did
    crowded: str = ""

    @property
    def value(self) -> float:
        return statistics.median(self.ratios)

    @property
    def pairs(self) -> int:
        return len(self.ratios)

    def _by_run(self) -> list[list[float]]:
        by_run: dict[str, list[float]] = {}
        for run, r in zip(self.runs, self.ratios, strict=True):
            by_run.setdefault(run, []).append(r)
        return list(by_run.values())

    def deviations(self) -> list[float]:
        """Each pair's distance from its run's ratio (none from a run of one pair); the spread
        between runs is ``per_run``'s."""
        return [abs(r - statistics.median(rs)) for rs in self._by_run() if len(rs) > 1 for r in rs]

    def per_run(self) -> list[float]:
        """The ratio of each run (the median of its pairs)."""
        return [statistics.median(rs) for rs in self._by_run()]

    def run_logs(self) -> dict[str, float]:
        """{run: ln(the run's ratio / this side's)}: how each run strays, for a combination of
        cells that share runs (``compare_strategy``)."""
        by_run: dict[str, list[float]] = {}
        for run, r in zip(self.runs, self.ratios, strict=True):
            by_run.setdefault(run, []).append(r)
        return {
            run: math.log(statistics.median(rs) / self.value) for run, rs in by_run.items() if self.value > 0
        }


@dataclass(frozen=True)
class NotJudged:
    """Why a ratio is not judged: ``reason`` in a few words ("one run", "3 timed steps", "more
    ranks than cores"), ``why`` the rule behind it."""

    reason: str
    why: str


def not_judged(ratio: Ratio, *, min_steps: int) -> NotJudged | None:
    """Why ``ratio`` can be neither faster nor slower in ``run``, nor regressed nor improved in
    ``compare``; None where it can. A crowded cell's step time is partly its wait for a core; a
    cell of fewer than ``min_steps`` timed steps has too few to tell from noise; a ratio of fewer
    than ``MIN_PAIRS`` pairs cannot tell a change from the drift between its cells."""
    if ratio.crowded:
        why = f"{ratio.crowded}: the ranks waited for their turn, so the step time is not the strategy's"
        return NotJudged(ratio.crowded, why)
    if ratio.steps < min_steps:
        steps = count(ratio.steps, "timed step")
        return NotJudged(steps, f"{steps}: too few to tell from noise (at least {min_steps})")
    if ratio.pairs < MIN_PAIRS:
        why = (
            f"{count(ratio.pairs, 'pair')} with {REFERENCE}: one run cannot tell a change from drift "
            f"between its cells; a ratio is judged from at least {MIN_PAIRS} pairs (run --repeat)"
        )
        return NotJudged(ONE_RUN, why)
    return None


def group_of(key: CellKey) -> tuple[Any, ...]:
    """The cell group of an identity: every field but the strategy."""
    return key.without("strategy")


def cell_ratios(cells: Mapping[CellKey, Sequence[Record]]) -> dict[CellKey, Ratio]:
    """{cell identity: its ratio to its group's ddp} for every cell that has one: not ddp itself,
    not a max-size answer, and with at least one pair (both ok and timed in the same run and
    repeat)."""
    reference = {group_of(k): rs for k, rs in cells.items() if k.strategy == REFERENCE}
    out = {}
    for key, records in cells.items():
        ref = reference.get(group_of(key))
        if key.strategy == REFERENCE or ref is None or any(r.max_size for r in records):
            continue
        if (ratio := ratio_of(records, ref)) is not None:
            out[key] = ratio
    return out


def pairs_of(records: Sequence[Record], reference: Sequence[Record]) -> list[tuple[Record, Record]]:
    """(cell's record, reference's record) of each run and repeat where both are ok and timed."""
    ours, theirs = _timed(records), _timed(reference)
    return [(ours[p], theirs[p]) for p in ours if p in theirs]


def ratio_of(records: Sequence[Record], reference: Sequence[Record]) -> Ratio | None:
    """A cell's ratio to its group's reference, pair by pair (``pairs_of``); None without a pair."""
    pairs = pairs_of(records, reference)
    if not pairs:
        return None
    ratios = tuple(step_time_ratio(a, b) or 0.0 for a, b in pairs)  # (_timed: both timed)
    return Ratio(
        runs=tuple(a.run_id for a, _ in pairs),
        crowded=next((o for pair in pairs for r in pair if (o := oversubscription(r))), ""),
        ratios=ratios,
        errors=tuple(
            r * math.hypot(_se(a.step_time_s), _se(b.step_time_s))
            for r, (a, b) in zip(ratios, pairs, strict=True)
        ),
        steps=min(int(r.step_time_s.get("n") or 0) for pair in pairs for r in pair),
    )


def pair_spread(ratios: Iterable[Ratio]) -> float:
    """How far a pair's ratio strays from its run's, relative to it, as a standard deviation,
    pooled over every cell given. A pair's spread comes from the machine (a cell's processes can
    sit in a slow mode as a whole), so every group of both runs measures it, and a cell's two
    pairs that happen to agree do not make its ratio look certain."""
    return _sd([d / r.value for r in ratios if r.value > 0 for d in r.deviations()])


def ratio_band(
    base: Ratio, cur: Ratio, *, k: float, pct: float, spread: float = 0.0
) -> tuple[float, float, float]:
    """(bound, relative threshold, k x combined standard error) for a change of ``cur`` from
    ``base``; ``spread``: ``pair_spread`` of the comparison. The bound is the larger of the two."""
    errors = statistics.median((*base.errors, *cur.errors))
    pairs = math.hypot(_pairs_error(base, spread, errors), _pairs_error(cur, spread, errors))
    b, c = base.per_run(), cur.per_run()
    runs = _pooled_sd(b, c) * math.hypot(1 / math.sqrt(len(b)), 1 / math.sqrt(len(c)))
    noise = k * max(pairs, runs)
    relative = pct / 100.0 * base.value
    return max(relative, noise), relative, noise


def _pairs_error(side: Ratio, spread: float, errors: float) -> float:
    """The standard error of a side's ratio from its pairs: per pair the machine's pair spread,
    this side's own where it is larger (two pairs that disagree), or the pairs' own error
    (``errors``) where steps are noisier still, over the square root of its pairs."""
    per_pair = max(spread * side.value, _sd(side.deviations()), errors)
    return _SD_TO_MEDIAN_SE * per_pair / math.sqrt(side.pairs)


def ratio_noise(side: Ratio, *, k: float, spread: float) -> float:
    """``k`` x the standard error of one side's ratio, as ``ratio_band`` takes each side's: from
    its pairs (``spread``: ``pair_spread`` of the run) or, where the side holds several runs,
    from the spread between them, whichever is larger. What a same-code rerun could move the
    ratio by: the noise a single run's speed verdict is judged against (``speed_verdict``)."""
    pairs = _pairs_error(side, spread, statistics.median(side.errors))
    runs = side.per_run()
    return k * max(pairs, _pooled_sd(runs) / math.sqrt(len(runs)))


def pooled_error(base: Ratio, cur: Ratio, *, spreads: tuple[float, float]) -> float:
    """The standard error of ``cur``'s change from ``base``, relative to ``base``, from each
    side's pair spread within a run pooled over all its cells (``spreads``: the baseline's and
    the current run's ``pair_spread``), or the side's steps' own errors where those are larger:
    the part of a cell's noise that is its own, which a combination of many cells averages out.
    Each side's from its own records, so a night on a loaded machine, whose pairs stray far more
    than the baseline's, widens its own error instead of borrowing the baseline's quiet. One
    side's spread in one cell, from two or three pairs, is an estimate too noisy to take the
    larger of cell by cell (``ratio_band`` does, for one cell's own verdict); the spread between
    runs moves a strategy's cells of one run together, and the combination measures it over
    them (``compare_strategy``). A side's ratio is the median of its pairs: of two or fewer,
    their mean, whose error is the spread over the root of their count."""
    terms = []
    for side, spread in zip((base, cur), spreads, strict=True):
        per_pair = max(spread, statistics.median(side.errors) / side.value)
        terms.append(per_pair * side.value / base.value * _median_se(side.pairs))
    return math.hypot(*terms)


def _median_se(n: int) -> float:
    """The standard error of the median of ``n`` values, over their standard deviation."""
    return (1.0 if n <= 2 else _SD_TO_MEDIAN_SE) / math.sqrt(n)


def _sd(deviations: list[float]) -> float:
    """Distances from a centre as a standard deviation (their median, scaled); 0 for none."""
    return _MAD_TO_SD * statistics.median(deviations) if deviations else 0.0


def _pooled_sd(*sides: list[float]) -> float:
    """The standard deviation of run ratios about their own side's mean, pooled (0 when no side
    has two runs): how far one run's ratio strays from another's of the same code."""
    squares = sum((x - statistics.fmean(side)) ** 2 for side in sides for x in side)
    freedom = sum(len(side) - 1 for side in sides)
    return math.sqrt(squares / freedom) if freedom > 0 else 0.0


def _timed(records: Sequence[Record]) -> dict[tuple[str, int], Record]:
    """{(run, repeat): record} of the ok, timed records."""
    return {
        (r.run_id, r.repeat): r
        for r in records
        if r.status == "ok" and r.step_time_s and r.step_time_s.get("median")
    }


def _se(t: dict[str, Any]) -> float:
    """The relative standard error of a median of ``n`` steps, from their MAD."""
    n = max(int(t.get("n") or 1), 1)
    return _SD_TO_MEDIAN_SE * _MAD_TO_SD * (t.get("mad") or 0.0) / t["median"] / math.sqrt(n)
