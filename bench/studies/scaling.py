"""Scaling efficiency: how much of one rank's throughput each rank keeps when N ranks train.

    efficiency = (samples/s at N / N) / (samples/s at N = 1)

at the same per-rank batch (weak scaling: each rank's work is the same at every N), so 1.0 is
ideal scaling and below it is what communication, waiting and sharding's bookkeeping cost.
With equal per-rank batches it is the N = 1 cell's median step time over the N-rank cell's.

*The same cell at N = 1* is one definition for every strategy: at N = 1 every strategy holds
the whole model on one process (a shard of one is everything), so the reference is the
reference strategy's cell (ddp: a single process, nothing sharded) at world size 1 with the
same workload, preset, precision, per-rank batch, activation checkpointing and device, on real
ranks, in the same run. Each strategy at N is set against that one cell, so the efficiency
counts everything the strategy adds over plain single-process training.

A record at N is paired with the reference's record of the same run and repeat (``run
--scaling`` measures them in the same rounds, ``harness.runner.interleave_repeats``): a drift
of the machine's speed between rounds hits both. A cell's efficiency over its repeats is the
median of its pairs'; whether it differs from ideal is judged by the speed verdict on the two
step times (``studies.speed_verdict``): "below ideal" or "above ideal" only beyond the spread
between repeats, "within noise" of ideal, or not judged (one run; more ranks than cores).

Where no efficiency can be formed the reason says why (no N = 1 cell in the run, a simulated
world that timed no communication, ...), so a table never shows a blank that reads as 0. Ranks
that outnumbered the host's cores, or that each had fewer threads than the N = 1 cell had (the
host's cores shared among them), are flagged beside the figure: the efficiency then includes
the loss of the cores the N = 1 cell had to itself.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from shardbench.records import CellKey, Record, oversubscription
from shardbench.studies.reference import REFERENCE
from shardbench.studies.speed_verdict import (
    FASTER,
    NOT_JUDGED,
    SLOWER,
    WITHIN_NOISE,
    SpeedVerdict,
    speed_verdict,
)

#: why a record has no efficiency
NO_REFERENCE = "no N=1 cell in its run"
NO_REFERENCE_REPEAT = "no N=1 cell in its run and repeat"
SIMULATED = "simulated: no communication timed"
AT_ONE = "N=1: the reference world size"
#: why an efficiency whose ranks had fewer threads than the N=1 cell is not judged
FEWER_THREADS = "fewer threads a rank than at N=1"
FEWER_THREADS_WHY = (
    "the ranks shared the cores the N=1 cell had to itself: below 1.00 even without communication "
    "on compute-bound work, above it where one process's threads gained less than a rank's own core"
)
#: the efficiency verdict's words for the step-time verdict's
WORDS = {SLOWER: "below ideal", FASTER: "above ideal", WITHIN_NOISE: "within noise of ideal"}


@dataclass(frozen=True)
class Scaling:
    """One record's scaling efficiency, or why it has none; ``flags`` say what to read it with."""

    efficiency: float | None
    why: str = ""
    flags: tuple[str, ...] = ()

    def text(self) -> str:
        """ "0.48", "0.48 (more ranks than cores)", "none: no N=1 cell in its run"."""
        if self.efficiency is None:
            return f"none: {self.why}" if self.why else ""
        return f"{self.efficiency:.2f}" + (f" ({'; '.join(self.flags)})" if self.flags else "")


@dataclass(frozen=True)
class CellScaling:
    """A cell's efficiency over its repeats (the median of its pairs') and its noise verdict."""

    efficiency: float
    pairs: int
    verdict: SpeedVerdict | None
    flags: tuple[str, ...] = ()

    @property
    def word(self) -> str:
        """ "below ideal", "above ideal", "within noise of ideal" or "not judged"."""
        return WORDS.get(self.verdict.word, NOT_JUDGED) if self.verdict else NOT_JUDGED

    def text(self) -> str:
        """ "0.91 (3 repeats: below ideal)", "0.48 (one run: not judged)", "1.40 (not judged:
        N=1 had 2 threads, each of N=2's ranks 1)"."""
        v, flags = self.verdict, list(self.flags)
        if v is None:
            note = NOT_JUDGED
        elif v.reason == FEWER_THREADS:  # the flag itself says why
            why = next(f for f in flags if f.startswith("N=1 had"))
            note = f"{NOT_JUDGED}: {flags.pop(flags.index(why))}"
        elif v.pairs > 1 and v.band is not None:
            note = f"{v.pairs} repeats: {self.word}"
        else:
            note = f"{v.reason}: {self.word}" if v.reason else self.word
        flags = [f for f in flags if not (v and f == v.reason)]  # said once, by the verdict
        return f"{self.efficiency:.2f} ({'; '.join((note, *flags))})"


def reference_key(r: Record) -> CellKey:
    """The key of ``r``'s N = 1 cell: the reference strategy at world size 1, all else equal."""
    return CellKey.of(r)._replace(strategy=REFERENCE, world_size=1, shard_group=None)


def is_reference(r: Record) -> bool:
    """``r`` is an N = 1 cell of the reference strategy on a real rank: a reference."""
    return r.strategy == REFERENCE and r.world_size == 1 and not r.simulated and not r.fake


def _timed(r: Record) -> bool:
    return r.status == "ok" and bool(r.samples_per_s) and bool((r.step_time_s or {}).get("median"))


def pair_efficiency(ours: Record, reference: Record) -> float:
    """Per-rank samples/s of ``ours`` over the N = 1 ``reference``'s samples/s."""
    assert ours.samples_per_s and reference.samples_per_s
    return ours.samples_per_s / ours.world_size / reference.samples_per_s


def flags_of(ours: Record, reference: Record) -> tuple[str, ...]:
    """What an efficiency must be read with: ranks that outnumbered their cores, or that each
    computed with fewer threads than the N = 1 cell (the host's cores shared among them)."""
    out = [crowded] if (crowded := oversubscription(ours)) else []
    mine, theirs = ours.threads_per_rank, reference.threads_per_rank
    if mine is not None and theirs is not None and mine != theirs:
        out.append(
            f"N=1 had {theirs} thread{'s' * (theirs != 1)}, each of N={ours.world_size}'s ranks {mine}"
        )
    return tuple(out)


def _references(records: Sequence[Record]) -> dict[CellKey, dict[tuple[str, int], Record]]:
    """{reference cell: {(run, repeat): record}} of the reference records of ``records``."""
    out: dict[CellKey, dict[tuple[str, int], Record]] = {}
    for r in records:
        if is_reference(r) and r.max_size is None:
            out.setdefault(CellKey.of(r), {})[(r.run_id, r.repeat)] = r
    return out


def record_scaling(records: Sequence[Record]) -> dict[int, Scaling]:
    """``{id(record): Scaling}`` for every ok record that could have an efficiency (a timed
    cell's, a simulated one's, an N = 1 one's): its value, or why it has none."""
    refs = _references(records)
    out = {}
    for r in records:
        if r.status != "ok" or r.max_size is not None or r.fake:
            continue
        if r.world_size == 1:
            out[id(r)] = Scaling(None, AT_ONE)
            continue
        if r.simulated:
            out[id(r)] = Scaling(None, SIMULATED)
            continue
        runs = refs.get(reference_key(r), {})
        ref = runs.get((r.run_id, r.repeat))
        if ref is None:
            in_run = any(run == r.run_id for run, _ in runs)
            out[id(r)] = Scaling(None, NO_REFERENCE_REPEAT if in_run else NO_REFERENCE)
        elif ref.status != "ok":
            out[id(r)] = Scaling(None, f"its N=1 cell {ref.status}")
        elif not _timed(r) or not _timed(ref):
            out[id(r)] = Scaling(None, "no samples/s" if not _timed(r) else "its N=1 cell has no samples/s")
        else:
            out[id(r)] = Scaling(pair_efficiency(r, ref), flags=flags_of(r, ref))
    return out


def cell_scaling(records: Sequence[Record]) -> dict[CellKey, CellScaling]:
    """``{cell: CellScaling}`` for every real cell at N > 1 with at least one pair (its record
    and its N = 1 cell's of the same run and repeat, both timed)."""
    refs = _references(records)
    cells: dict[CellKey, list[Record]] = {}
    for r in records:
        if r.status == "ok" and r.max_size is None and r.world_size > 1 and not r.simulated and not r.fake:
            cells.setdefault(CellKey.of(r), []).append(r)
    out = {}
    for key, rs in cells.items():
        ref_runs = refs.get(reference_key(rs[0]), {})
        pairs = [
            (r, ref) for r in rs if (ref := ref_runs.get((r.run_id, r.repeat))) and _timed(r) and _timed(ref)
        ]
        if not pairs:
            continue
        efficiency = statistics.median(pair_efficiency(r, ref) for r, ref in pairs)
        verdict = speed_verdict([r for r, _ in pairs], [ref for _, ref in pairs])
        flags = tuple(dict.fromkeys(f for r, ref in pairs for f in flags_of(r, ref)))
        if verdict is not None and verdict.word != NOT_JUDGED and any(f.startswith("N=1 had") for f in flags):
            # each rank computed on a share of the cores the N=1 cell had whole: not the same
            # rank's hardware, so ideal (1.00) is not what it would reach without communication
            verdict = replace(verdict, word=NOT_JUDGED, reason=FEWER_THREADS, rule=FEWER_THREADS_WHY)
        out[key] = CellScaling(efficiency, len(pairs), verdict, flags)
    return out


def scaling_texts(records: Sequence[Record]) -> dict[CellKey, str]:
    """What the terminal and the report say of each real cell at N > 1, once any has an
    efficiency: its efficiency and verdict ("0.80 (one run: not judged)"), or why it has none
    ("none: no N=1 cell in its run"); {} when no cell has one (nothing asked for it)."""
    cells = cell_scaling(records)
    if not cells:
        return {}
    single = record_scaling(records)
    out = {}
    for r in records:
        key = CellKey.of(r)
        if key in out or (s := single.get(id(r))) is None or r.world_size == 1 or r.simulated:
            continue
        out[key] = cells[key].text() if key in cells else s.text()
    return out
