"""A strategy's step time across a whole comparison: every cell's change in its ratio to ddp,
combined.

A change in a strategy's code (a slower hook, one more collective) slows it in every workload it
runs; noise does not: each cell's ratio strays on its own. On the 2-core CPU machine, at 15 timed
steps, one pair's ratio strays 7-25 % between runs of the same code, so one cell's own test, at
3 standard errors, lets a 30 % slowdown through. Combined over a suite's cells of the strategy
(one device), the error shrinks with the square root of their count: four workloads halve it.

The combined change is the mean of the cells' log changes (``ln(current / baseline)``, so a
halving and a doubling weigh alike), its standard error the cells' errors combined (each from
``compare_ratios.ratio_band``), over their count. It regressed when slower by more than both a
relative threshold (the rules' strategy-wide one, ``compare_rules.STRATEGY_PCT``: below a cell's,
since the combined error is smaller) and ``k`` times that error, as a cell's test is judged.

What the night could have seen is said with the verdict: the smallest true slowdown it would
call regressed in ``POWER`` of nights (4 in 5) with this error, ``band + z x error`` in logs
(``z`` the standard normal's ``POWER`` quantile): a change right at the band is caught only every
other night, and the observed change strays about the true one by the error.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
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

    def describe(self) -> str:
        """``zero2 on cpu: +31.2% over 4 cells (band +/-9.0%: k x combined standard error;
        threshold 5%, noise 9.0%); could detect >= 12.1% (80% of nights)``."""
        noisier = self.noise_pct > self.threshold_pct
        which = "k x combined standard error" if noisier else "relative threshold"
        return (
            f"{self.strategy} on {self.device}: {self.change_pct:+.1f}% "
            f"over {count(len(self.cells), 'cell')} "
            f"(band +/-{self.bound_pct:.1f}%: {which}; threshold {self.threshold_pct:g}%, "
            f"noise {self.noise_pct:.1f}%); could detect >= {self.detectable_pct:.1f}% "
            f"({POWER:.0%} of nights)"
        )


def strategy_deltas(changes: Iterable[CellChange]) -> list[StrategyDelta]:
    """One ``StrategyDelta`` per strategy and device with at least ``MIN_CELLS`` cells."""
    groups: dict[tuple[str, str], list[CellChange]] = {}
    for c in changes:
        groups.setdefault((c.strategy, c.device), []).append(c)
    out = []
    for (strategy, device), cells in sorted(groups.items()):
        if len(cells) < MIN_CELLS:
            continue
        n = len(cells)
        mean = sum(c.log_change for c in cells) / n
        error = math.sqrt(sum(c.error**2 for c in cells)) / n
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
