"""A strategy's step time across a whole comparison: every cell's change in its ratio to ddp,
combined.

A change in a strategy's code (a slower hook, one more collective) slows it in every workload it
runs; noise does not: each cell's ratio strays on its own. On the 2-core CPU machine, at 15 timed
steps, one pair's ratio strays 7-25 % between runs of the same code, so one cell's own test, at
3 standard errors, lets a 30 % slowdown through. Combined over a suite's cells of the strategy
(one device), the error of what each cell does on its own shrinks with the square root of their
count: four workloads halve it.

The combined change is the mean of the cells' log changes (``ln(current / baseline)``, so a
halving and a doubling weigh alike). Its standard error is the larger of two. The cells' own
errors (``compare_ratios.pooled_error``: the pairs' spread within a run) combined over their
count, since each cell strays on its own. And the spread between runs of the combination
itself: a run can sit in one mode as a whole (the machine's load moves the share of
communication in every step), which moves all of a strategy's cells of that run together and
does not average out over them; so each run's mean log ratio over the strategy's cells is taken
from its side's, and their standard deviation, pooled over the strategies of the device and
both sides' runs, over the square root of each side's runs, is the second. It regressed when
slower by more than both a relative threshold (the rules' strategy-wide one,
``compare_rules.STRATEGY_PCT``: below a cell's, since the combined error is smaller) and ``k``
times that error, as a cell's test is judged.

What the night could have seen is said with the verdict: the smallest true slowdown it would
call regressed in ``POWER`` of nights (4 in 5) with this error, ``band + z x error`` in logs
(``z`` the standard normal's ``POWER`` quantile): a change right at the band is caught only every
other night, and the observed change strays about the true one by the error.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from statistics import NormalDist

from shardbench.wording import count

#: fewer cells than this: the cells' own tests say it all
MIN_CELLS = 2
#: the share of nights in which a slowdown of ``StrategyDelta.detectable_pct`` is caught
POWER = 0.8


@dataclass(frozen=True)
class CellChange:
    """One cell's change in its step-time ratio to ddp, as the combination reads it."""

    strategy: str
    device: str
    cell: str
    #: ln(current ratio / baseline ratio)
    log_change: float
    #: the change's standard error, relative to the baseline ratio
    error: float
    #: the cell's relative threshold, % of the baseline ratio, and its k
    pct: float
    k: float
    #: {run: ln(run's ratio / side's ratio)} of each side (``Ratio.run_logs``)
    base_runs: Mapping[str, float] = field(default_factory=dict)
    cur_runs: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StrategyDelta:
    """A strategy's combined change over the cells of one device."""

    strategy: str
    device: str
    cells: tuple[str, ...]
    #: the combined change, % of the baseline ratio
    change_pct: float
    #: the band it is judged by, % (the larger of the two below)
    bound_pct: float
    #: the relative threshold, %, and k x the combined standard error, %
    threshold_pct: float
    noise_pct: float
    verdict: str
    #: the smallest slowdown, %, this night would call regressed in ``POWER`` of nights
    detectable_pct: float = math.nan

    @property
    def regressed(self) -> bool:
        return self.verdict == "regressed"

    @property
    def band_text(self) -> str:
        """The band both ways, as the change is judged (in logs, so a slowdown's bound and a
        speed-up's differ as percentages): ``-13.6%/+15.8%``."""
        faster = 100.0 * (1.0 / (1.0 + self.bound_pct / 100.0) - 1.0)
        return f"{faster:.1f}%/+{self.bound_pct:.1f}%"

    def describe(self) -> str:
        """``zero2 on cpu: +31.2% over 4 cells (band +/-9.0%: k x combined standard error;
        threshold 5%, noise 9.0%); could detect >= 12.1% (80% of nights)``."""
        noisier = self.noise_pct > self.threshold_pct
        which = "k x combined standard error" if noisier else "relative threshold"
        return (
            f"{self.strategy} on {self.device}: {self.change_pct:+.1f}% "
            f"over {count(len(self.cells), 'cell')} "
            f"(band {self.band_text}: {which}; threshold {self.threshold_pct:g}%, "
            f"noise {self.noise_pct:.1f}%); could detect >= {self.detectable_pct:.1f}% "
            f"({POWER:.0%} of nights)"
        )


def strategy_deltas(changes: Iterable[CellChange]) -> list[StrategyDelta]:
    """One ``StrategyDelta`` per strategy and device with at least ``MIN_CELLS`` cells."""
    groups: dict[tuple[str, str], list[CellChange]] = {}
    for c in changes:
        groups.setdefault((c.strategy, c.device), []).append(c)
    groups = {g: cells for g, cells in groups.items() if len(cells) >= MIN_CELLS}
    spread = run_spread(groups)
    out = []
    for (strategy, device), cells in sorted(groups.items()):
        n = len(cells)
        mean = sum(c.log_change for c in cells) / n
        own = math.sqrt(sum(c.error**2 for c in cells)) / n
        base_runs = statistics.median(len(c.base_runs) for c in cells)
        cur_runs = statistics.median(len(c.cur_runs) for c in cells)
        runs = (
            spread.get(device, 0.0) * math.hypot(1 / math.sqrt(base_runs), 1 / math.sqrt(cur_runs))
            if base_runs and cur_runs
            else 0.0
        )
        error = max(own, runs)
        k = statistics.median(c.k for c in cells)
        pct = statistics.median(c.pct for c in cells)
        bound = max(math.log1p(pct / 100.0), k * error)
        verdict = "regressed" if mean > bound else "improved" if mean < -bound else "unchanged"
        out.append(
            StrategyDelta(
                strategy=strategy,
                device=device,
                cells=tuple(c.cell for c in cells),
                change_pct=100.0 * math.expm1(mean),
                bound_pct=100.0 * math.expm1(bound),
                threshold_pct=pct,
                noise_pct=100.0 * math.expm1(k * error),
                verdict=verdict,
                detectable_pct=100.0 * math.expm1(bound + NormalDist().inv_cdf(POWER) * error),
            )
        )
    return out


def run_spread(groups: Mapping[tuple[str, str], list[CellChange]]) -> dict[str, float]:
    """{device: the standard deviation of a run's mean log ratio over a strategy's cells about
    its side's}, pooled over every strategy of the device and both sides' runs (0 where no side
    has two runs). A run's mean counts the cells that ran in it."""
    squares: dict[str, float] = {}
    freedom: dict[str, int] = {}
    for (_, device), cells in groups.items():
        for side in ("base_runs", "cur_runs"):
            by_run: dict[str, list[float]] = {}
            for c in cells:
                for run, log in getattr(c, side).items():
                    by_run.setdefault(run, []).append(log)
            means = [statistics.fmean(logs) for logs in by_run.values()]
            if len(means) > 1:
                centre = statistics.fmean(means)
                squares[device] = squares.get(device, 0.0) + sum((m - centre) ** 2 for m in means)
                freedom[device] = freedom.get(device, 0) + len(means) - 1
    return {d: math.sqrt(squares[d] / freedom[d]) for d in freedom}
