"""A run's speed verdict: whether a strategy's step time differs from ddp's by more than a rerun
of the same code would show.

A cell's timed steps measure only the noise within the cell. The cells of a run are measured one
after another, and the machine drifts between them: the same run, twice on the same code, set
transformer tiny zero2 at 0.64x ddp's step time once and at 1.01x the next time, each far
beyond its steps' MAD. So a ratio is judged against the spread between repeats of the cells
(``run --repeat R``: the cells run round after round, so each strategy's repeat i is paired with
ddp's repeat i, measured minutes apart at most). Its band is ``compare``'s ratio rule
(``compare_ratios.ratio_noise``): k x the standard error of the cell's ratio, from its pairs'
spread (pooled over the run's cells, the cell's own where larger, its steps' own where noisier
still) and the spread between runs where several are merged. Then:

* faster (slower): the whole band, ratio +/- noise, lies below (above) 1, and the ratio is
  beyond the time tolerance below: a difference the gate would call (a ratio of 1.10 +/- 0.09
  on the CPU is beyond its noise, but a rerun sets it at 1.06 +/- 0.11: it is not judged);
* within noise: the band holds 1 and the whole band, ratio +/- noise, lies within 1 +/-
  ``compare``'s time tolerance (CPU 15%, CUDA 5%: a change it would not call a regression), so
  the two are as fast as each other;
* not judged: the band holds 1 but is wider than that, so a rerun could call it either way.

One pair (one run, no repeats) cannot measure the spread between cells: it is never faster or
slower, and within noise only where its band from the steps' MAD (``step_noise``) holds 1 and is
that narrow. A cell whose ranks outnumbered the cores (or devices) they ran on waited for its
turn, so its step time is never judged.

Two same-code runs on one machine then never say faster and within noise of one cell: on the
nightly baseline's runs of two repeats, every pair of a processor's runs agrees on every cell
(``tests/test_speed_verdict.py``), where the steps' MAD alone disagrees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from shardbench.records import CellKey, Record
from shardbench.studies.compare_ratios import (
    ONE_RUN,
    cell_ratios,
    not_judged,
    pair_spread,
    pairs_of,
    ratio_noise,
    ratio_of,
)
from shardbench.studies.compare_rules import TIME_PCT, Thresholds, step_noise
from shardbench.studies.reference import REFERENCE, step_time_ratio

FASTER, SLOWER, WITHIN_NOISE, NOT_JUDGED = "faster", "slower", "within noise", "not judged"
RULE = (
    f"a step-time ratio is faster or slower where ratio ± {Thresholds.k_mad:g} standard errors of its "
    "repeats lies wholly below or above 1 and the ratio is beyond the tolerance, within noise where "
    f"that band holds 1 and lies within ±{TIME_PCT['cpu']:g}% (CPU; ±{TIME_PCT['cuda']:g}% CUDA), "
    "not judged otherwise"
)
REPEAT_HINT = (
    "one run cannot tell a speed-up from drift between its cells; --repeat 3 judges it by their spread"
)


@dataclass(frozen=True)
class SpeedVerdict:
    """A cell's step time against its group's ddp: the ratio (the median of its pairs'), the
    verdict (``FASTER``, ``SLOWER``, ``WITHIN_NOISE`` or ``NOT_JUDGED``), over how many pairs,
    the band it was judged by, why it was not judged, and the rule's own words."""

    ratio: float
    word: str
    pairs: int
    #: ratio +/- band is what a rerun could move it by (None where no band was formed)
    band: float | None = None
    #: why a ratio was not judged before any band: ``ONE_RUN``, "more ranks than cores",
    #: "3 timed steps"
    reason: str = ""
    #: what the difference was set against, in words (the report's tooltip)
    rule: str = ""

    @property
    def judged(self) -> bool:
        """The ratio is a result: faster or slower beyond the noise."""
        return self.word in (FASTER, SLOWER)

    def note(self, *, with_ratio: bool = True) -> str:
        """What a ratio line says beside the ratio: "within noise", "one run: not judged",
        "3 repeats: 0.89x ± 0.04, faster"; without the ratio and its band (``with_ratio=False``:
        beside another ratio of the same speed, as MFU's) "3 repeats: faster"."""
        if self.pairs > 1 and self.band is not None and not with_ratio:
            return f"{self.pairs} repeats: {self.word}"
        if self.pairs > 1 and self.band is not None:
            return f"{self.pairs} repeats: {self.ratio:.2f}x ± {self.band:.2f}, {self.word}"
        return f"{self.reason}: {self.word}" if self.reason else self.word


def speed_verdict(
    records: Sequence[Record], reference: Sequence[Record], *, spread: float = 0.0
) -> SpeedVerdict | None:
    """The verdict on a cell's repeats (``records``) against its group's reference cell's
    (``reference``), paired run by run and repeat by repeat; ``spread``: ``pair_spread`` of the
    run's cells. None where no pair of both is ok and timed."""
    ratio = ratio_of(records, reference)
    if ratio is None:
        return None
    pairs = pairs_of(records, reference)
    t, r, n = Thresholds(), ratio.value, ratio.pairs
    skipped = not_judged(ratio, min_steps=t.min_steps)  # compare's rule too: never faster or slower
    if skipped and skipped.reason != ONE_RUN:
        return SpeedVerdict(r, NOT_JUDGED, n, reason=skipped.reason, rule=skipped.why)
    tolerance = TIME_PCT.get(pairs[0][0].device, TIME_PCT["cpu"]) / 100.0
    if skipped:  # one pair: as fast as ddp at most, where its steps' noise says so
        ((ours, base),) = pairs
        band = step_noise(ours, base) / base.step_time_s["median"]  # relative, as the ratio is
        if _as_fast(r, band, tolerance):
            why = f"{r:.3f}x against 1 ± {band:.3f}: {t.k_mad:g} x the combined MAD of the two cells' steps"
            return SpeedVerdict(r, WITHIN_NOISE, 1, band, rule=why)
        return SpeedVerdict(r, NOT_JUDGED, 1, band, reason=ONE_RUN, rule=REPEAT_HINT)
    band = ratio_noise(ratio, k=t.k_mad, spread=spread)
    if abs(r - 1.0) > max(band, tolerance):  # the gate's rule: beyond the noise and the tolerance
        word = FASTER if r < 1.0 else SLOWER
    else:
        word = WITHIN_NOISE if _as_fast(r, band, tolerance) else NOT_JUDGED
    why = f"{r:.3f}x ± {band:.3f} ({t.k_mad:g} x its standard error over {n} pairs): {RULE}"
    return SpeedVerdict(r, word, n, band, rule=why)


def _as_fast(ratio: float, band: float, tolerance: float) -> bool:
    """As fast as each other: the band holds 1 and the whole band lies within the tolerance."""
    return abs(ratio - 1.0) <= band and abs(ratio - 1.0) + band <= tolerance


def unpaired(ours: Record, base: Record) -> SpeedVerdict | None:
    """The verdict on two timed cells that were never measured in the same run and round (a
    report merging a run of ddp with a run of zero2): not judged, since runs drift further apart
    than a run's cells do. None where either has no step time."""
    ratio = step_time_ratio(ours, base)
    if ratio is None:
        return None
    why = "measured in different runs or rounds: a run's drift is not in the cells' steps"
    return SpeedVerdict(ratio, NOT_JUDGED, 0, reason="different runs", rule=why)


def pair_verdict(ours: Record, base: Record) -> SpeedVerdict | None:
    """The verdict on two cells measured once each (``plan``'s, the claim's timing cells), paired
    whichever runs they came from (a resumed claim keeps cells of an earlier run)."""
    return speed_verdict([ours], [replace(base, run_id=ours.run_id, repeat=ours.repeat)])


def speed_verdicts(records: Sequence[Record]) -> dict[CellKey, SpeedVerdict]:
    """{cell: verdict} for every ok, timed cell of ``records`` (a run, or runs merged) other than
    its group's reference, where the group has a timed reference cell; every repeat of a cell is
    one of its pairs, and the run's cells pool their pairs' spread."""
    cells: dict[CellKey, list[Record]] = {}
    for r in records:
        if r.status == "ok" and not r.max_size:
            cells.setdefault(CellKey.of(r), []).append(r)
    ratios = cell_ratios(cells)
    spread = pair_spread(ratios.values())
    out = {}
    for key in ratios:
        reference = cells[key._replace(strategy=REFERENCE, shard_group=None)]
        verdict = speed_verdict(cells[key], reference, spread=spread)
        if verdict is not None:
            out[key] = verdict
    return out
