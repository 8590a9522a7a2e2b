"""The claim's results per workload and the rule that judges them, shared by the claim run,
its gate and its report.

The claim holds for a workload when zero2's peak is at most ``MEMORY_THRESHOLD`` x DDP's or its
largest trainable model is at least ``SIZE_THRESHOLD`` x DDP's (``WorkloadResult.verdict``); a
baseline's verdicts are recomputed from its records by the same rule
(``results_from_records``), never read from an old report's text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from shardbench.precision import MODEL_STATE_BYTES
from shardbench.records import Record
from shardbench.studies.claim_specs import ClaimSpec, ClaimWorkload
from shardbench.studies.reference import REFERENCE, step_time_ratio
from shardbench.studies.speed_verdict import FASTER, SLOWER, SpeedVerdict, pair_verdict
from shardbench.units import size_text
from shardbench.wording import first_sentence

#: the strategy the claim is about, and the one it is set against (the catalog's reference)
OURS, BASELINE = "zero2", REFERENCE
MEMORY_THRESHOLD, SIZE_THRESHOLD = 0.5, 2.0


def ratio_text(x: float | None, threshold: float | None = None) -> str:
    """A ratio as every claim text shows it (``0.50x``), ``?`` where it was not measured. Beside
    the ``threshold`` it is judged against, with as many more digits as keep the printed value
    on the same side of it as the real one: 0.502 against 0.5 is ``0.502x``, since ``0.50x``
    would read as the pass the rule did not give."""
    if x is None:
        return "?"
    for digits in range(2, 18):
        text = f"{x:.{digits}f}"
        if threshold is None or _side(float(text), threshold) == _side(x, threshold):
            return f"{text}x"
    return f"{x!r}x"


def _side(x: float, threshold: float) -> int:
    return (x > threshold) - (x < threshold)


@dataclass
class WorkloadResult:
    workload: ClaimWorkload
    memory: dict[str, Record] = field(default_factory=dict)  # strategy -> simulated-N record
    timing: dict[str, Record] = field(default_factory=dict)  # strategy -> timing record
    max_size: dict[str, Record] = field(default_factory=dict)  # strategy -> max-size summary
    #: strategy -> memory record on real ranks (N = the spec's timing world size): the peers that
    #: cannot be simulated, with ddp and zero2 at the same N to set them against
    real_memory: dict[str, Record] = field(default_factory=dict)

    def real_peak(self, strategy: str) -> int | None:
        r = self.real_memory.get(strategy)
        return (r.peak_mem_bytes or {}).get("max") if r is not None and r.status == "ok" else None

    def real_peak_ratio(self, strategy: str) -> float | None:
        peak, base = self.real_peak(strategy), self.real_peak(BASELINE)
        return peak / base if peak and base else None

    def peer_verdicts(self) -> list[tuple[str, bool | None, str]]:
        """(peer, holds, text) for each peer measured on real ranks: its peak against DDP's at
        the same N, ours beside it, what ZeRO-2's model states allow at that N, and where the
        peer's peak differs most from ours."""
        out = []
        ours, base = self.real_memory.get(OURS), self.real_memory.get(BASELINE)
        for peer, r in self.real_memory.items():
            if peer in (BASELINE, OURS):
                continue
            n = r.world_size
            ratio = self.real_peak_ratio(peer)
            if ratio is None:
                why = first_sentence(r.error) if r.status != "ok" else f"{BASELINE}'s cell failed"
                out.append((peer, None, f"not measured at real N={n}: {r.status}, {why}"))
                continue
            text = f"peak = {ratio_text(ratio, MEMORY_THRESHOLD)} {BASELINE} at real N={n}"
            if (mine := self.real_peak_ratio(OURS)) is not None:
                text += f" (ours, zero2: {ratio_text(mine, MEMORY_THRESHOLD)})"
            floor = _model_state_floor(r, base)
            if floor is not None and floor > MEMORY_THRESHOLD:
                text += (
                    f"; at N={n} ZeRO-2's model states are at best {ratio_text(floor, MEMORY_THRESHOLD)} "
                    "DDP's (their formula), "
                    "so halving needs more ranks"
                )
            if (
                ours is not None
                and ours.status == "ok"
                and r.mem_breakdown_bytes
                and ours.mem_breakdown_bytes
            ):
                diff = {k: v - ours.mem_breakdown_bytes.get(k, 0) for k, v in r.mem_breakdown_bytes.items()}
                top = max(diff, key=lambda k: abs(diff[k]))
                if diff[top]:
                    more = "more" if diff[top] > 0 else "less"
                    text += f"; against ours its peak holds {abs(diff[top]) / 2**20:.0f} MiB {more} {top}"
            out.append((peer, ratio <= MEMORY_THRESHOLD, text))
        return out

    def peak(self, strategy: str) -> int | None:
        r = self.memory.get(strategy)
        return (r.peak_mem_bytes or {}).get("max") if r is not None and r.status == "ok" else None

    def memory_ratio(self) -> float | None:
        return self.peak_ratio(OURS)

    def peak_ratio(self, strategy: str) -> float | None:
        ours, base = self.peak(strategy), self.peak(BASELINE)
        return ours / base if ours and base else None

    def size_ratio(self, strategy: str = OURS) -> tuple[float | None, float | None, float | None]:
        """(measured, lower bound, upper bound) of ``strategy``'s / ddp's largest trainable params."""
        ours, base = (self.max_size.get(s) for s in (strategy, BASELINE))
        if not ours or not base or not ours.max_size or not base.max_size:
            return None, None, None
        o_fit, b_fit = ours.max_size["largest_fit"], base.max_size["largest_fit"]
        o_fail, b_fail = ours.max_size["smallest_fail"], base.max_size["smallest_fail"]
        if not o_fit or not b_fit or (not o_fail and not b_fail):
            return None, None, None  # nothing fitted, or the whole ladder fitted both: no boundary
        ratio = o_fit["params"] / b_fit["params"]
        lower = o_fit["params"] / b_fail["params"] if b_fail else None
        upper = o_fail["params"] / b_fit["params"] if o_fail else None
        return ratio, lower, upper

    def size_decides(self) -> bool | None:
        """Whether zero2's largest model is >= 2x DDP's, judged on the brackets: True only when
        even the least favourable end (zero2's fit over DDP's smallest non-fit) reaches it,
        False when even the most favourable end does not, None in between (or unmeasured)."""
        size, lower, upper = self.size_ratio()
        if size is None:
            return None
        if (lower if lower is not None else size) >= SIZE_THRESHOLD:
            return True
        if (upper if upper is not None else size) < SIZE_THRESHOLD:
            return False
        return None

    def outcome(self, world_size: int) -> str:
        """The verdict as docs/claim.md words it: "holds", "does not hold", "undecided" (the
        memory test fails and the size test, searched, is unresolved: its brackets straddle 2x,
        no boundary was found in the sizes searched, or a search failed) or "not measured"."""
        holds, _ = self.verdict(world_size)
        if holds is None:
            return "not measured"
        if holds:
            return "holds"
        searched = all(s in self.max_size for s in (OURS, BASELINE))
        return "undecided" if searched and self.size_decides() is None else "does not hold"

    def time_ratio(self) -> float | None:
        ours, base = self.timing.get(OURS), self.timing.get(BASELINE)
        if ours is None or base is None or ours.status != "ok" or base.status != "ok":
            return None
        return step_time_ratio(ours, base) or None

    def time_verdict(self) -> SpeedVerdict | None:
        """zero2's step time against DDP's, as a run's ratio lines judge it (``pair_verdict``:
        one timing run is within its steps' noise or not judged); None when unmeasured."""
        ours, base = self.timing.get(OURS), self.timing.get(BASELINE)
        if ours is None or base is None:
            return None
        return pair_verdict(ours, base)

    def cost_line(self, strategies: Sequence[str]) -> str:
        """What each of ``strategies`` costs in throughput beside what it saves in memory, set
        against DDP: "zero2: throughput 0.95x ddp (one run: not judged), peak 0.62x ddp; ...".
        Throughput is samples/s at the timing cells' N and equal per-rank batch, so its ratio
        is the inverse of the step times'; it is higher or lower only where the step times'
        verdict (``pair_verdict``) says so, never within their noise."""
        base = self.timing.get(BASELINE)
        parts = []
        for s in strategies:
            ours = self.timing.get(s)
            ok = ours is not None and base is not None and ours.status == base.status == "ok"
            time = step_time_ratio(ours, base) if ok else None  # type: ignore[arg-type]
            cost = "throughput not measured"
            if time:
                verdict = pair_verdict(ours, base)  # type: ignore[arg-type]
                cost = f"throughput {1 / time:.2f}x {BASELINE}"
                cost += f" ({throughput_note(verdict)})" if verdict else ""
            peak = self.peak_ratio(s)
            parts.append(f"{s}: {cost}" + (f", peak {ratio_text(peak)} {BASELINE}" if peak else ""))
        return "; ".join(parts)

    def verdict(self, world_size: int) -> tuple[bool | None, str]:
        mem, (size, lower, upper) = self.memory_ratio(), self.size_ratio()
        if mem is None and size is None:
            return None, "not measured: " + self._failures()
        by_size = self.size_decides()
        holds = (mem is not None and mem <= MEMORY_THRESHOLD) or by_size is True
        parts = []
        if mem is not None:
            parts.append(f"{OURS} peak = {ratio_text(mem, MEMORY_THRESHOLD)} {BASELINE}")
        if size is not None:
            between = f"{ratio_text(lower, SIZE_THRESHOLD)} and {ratio_text(upper, SIZE_THRESHOLD)}"
            bounds = f" (between {between}: the searches' brackets"
            if by_size is None:
                bounds += f", which straddle {SIZE_THRESHOLD:g}x: undecided at this resolution"
            parts.append(
                f"largest trainable = {ratio_text(size, SIZE_THRESHOLD)} {BASELINE}"
                + (bounds + ")" if lower or upper else "")
            )
        elif failed := [r for r in self.max_size.values() if r.status not in ("ok", "oom")]:
            parts.append(
                "largest trainable: search failed ("
                + "; ".join(f"{r.strategy}: {first_sentence(r.error)}" for r in failed)
                + ")"
            )
        else:
            parts.append("largest trainable: no boundary found in the sizes searched")
        t, judged = self.time_ratio(), self.time_verdict()
        parts.append(
            f"step time {t:.2f}x {BASELINE}" + (f" ({judged.note()})" if judged else "")
            if t is not None
            else "step time not measured"
        )
        text = "; ".join(parts)
        if not holds:
            text += ". " + self.why_not(world_size)
        return holds, text

    def why_not(self, world_size: int) -> str:
        """Why zero2's peak is above half of DDP's: what DDP's peak is made of, and the least a
        perfect ZeRO-2 would hold at the moment zero2 peaked (``perfect_bound``) beside what
        zero2 measured, with what it held beyond that."""
        base = self.memory.get(BASELINE)
        bd = (base.mem_breakdown_bytes or {}) if base else {}
        total = sum(bd.values())
        if not total:
            return ""
        act = (bd.get("activations", 0) + bd.get("other", 0)) / total
        text = (
            f"DDP's peak is {bd.get('params', 0) / total:.0%} parameters and {act:.0%} activations and "
            "inputs, which ZeRO-2 does not shard"
        )
        perfect = self.perfect_bound(world_size)
        peak = self.peak(OURS)
        if perfect is None or not peak:
            return text + "."
        held, beyond = perfect
        floor = math.floor(held / total * 100) / 100  # a lower bound: never printed above itself
        text += (
            f": at zero2's peak even a perfect ZeRO-2 would hold at least {floor:.2f}x DDP's peak (its "
            f"{self.memory[OURS].precision} parameters, its optimizer shard, that moment's activations "
            "and inputs)"
        )
        if floor > MEMORY_THRESHOLD:
            text += ", so none halves it here"
        top = max(beyond, key=lambda k: beyond[k])
        if beyond[top] > 0.02 * total:
            text += (
                f"; zero2 measured {ratio_text(peak / total, MEMORY_THRESHOLD)}, holding "
                f"{size_text(sum(beyond.values()))} beyond that, most of it {top} (+{size_text(beyond[top])})"
            )
        return text + "."

    def perfect_bound(self, world_size: int) -> tuple[int, dict[str, int]] | None:
        """(bytes, what zero2 held beyond them by category): the least a perfect ZeRO-2 holds at
        the moment zero2's peak was measured, from that moment's breakdown. After its first step
        any ZeRO-2 holds, at every moment, its parameters whole and its shard of the optimizer
        state (the bytes per parameter of the run's precision: 4 and 8/N at fp32, 2 and 12/N at
        fp16 and bf16), the activations of that moment, and of the rest (buffers, inputs) no less
        than the least zero2 or DDP held. Gradients are left out: a perfect ZeRO-2 may hold none of
        them at that moment. Each part is at most what zero2 held, so the bound is never above
        what was measured. None where a breakdown, the parameter count or the precision is
        unknown: no number is better than one that can be wrong."""
        base, ours = self.memory.get(BASELINE), self.memory.get(OURS)
        if base is None or ours is None or ours.status != "ok" or not ours.params:
            return None
        bd, mine = base.mem_breakdown_bytes or {}, ours.mem_breakdown_bytes or {}
        states = MODEL_STATE_BYTES.get(ours.precision)
        if not bd or not mine or states is None:
            return None
        least = {
            "params": min(ours.params * states.parameter, mine.get("params", 0)),
            "optimizer": min(ours.params * states.optimizer // world_size, mine.get("optimizer", 0)),
            "activations": mine.get("activations", 0),
            "other": min(bd.get("other", 0), mine.get("other", 0)),
        }
        beyond = {k: v - least.get(k, 0) for k, v in mine.items()}
        return min(sum(least.values()), self.peak(OURS) or 0), beyond

    def _failures(self) -> str:
        bad = [r for r in [*self.memory.values(), *self.max_size.values()] if r.status != "ok"]
        return "; ".join(f"{r.strategy}: {r.status} {first_sentence(r.error)}" for r in bad) or "no records"


def throughput_note(v: SpeedVerdict) -> str:
    """The step-time verdict in throughput's words: a faster step is higher throughput, a slower
    one lower; "within noise" and "not judged" (with why: "one run") as they are."""
    word = {FASTER: "higher", SLOWER: "lower"}.get(v.word, v.word)
    if v.pairs > 1 and v.band is not None:
        return f"{v.pairs} repeats: {word}"
    return f"{v.reason}: {word}" if v.reason else word


def _model_state_floor(peer: Record, base: Record | None) -> float | None:
    """The ZeRO formula's model states of ``peer``'s sharding over DDP's at its N (both
    predicted in their records): the lowest peak ratio the claim could measure if nothing but
    model states were in memory."""
    ours = (peer.predicted_mem_bytes or {}).get("total")
    theirs = ((base.predicted_mem_bytes if base else None) or {}).get("total")
    return ours / theirs if ours and theirs else None


def results_from_records(spec: ClaimSpec, records: Sequence[Record]) -> list[WorkloadResult]:
    """The claim's per-workload results rebuilt from its records (the last record of each role
    wins, as in a run that repeated a cell); workloads with no record are left out."""
    results = []
    for w in spec.variants():
        res = WorkloadResult(w)
        for r in records:
            if r.workload != w.name or bool(r.activation_checkpointing) != w.activation_checkpointing:
                continue
            if r.precision != spec.precision:  # a claim at another precision is another claim
                continue
            if r.max_size is not None:
                res.max_size[r.strategy] = r
            elif r.suite == f"claim-{spec.name}" and r.preset == w.preset and not r.fake:
                if r.simulated and r.world_size == spec.world_size:
                    res.memory[r.strategy] = r
                elif (
                    not r.simulated
                    and r.world_size == spec.timing_world_size
                    and (r.peak_mem_bytes or r.strategy not in (BASELINE, OURS, *spec.further))
                ):  # memory tracked (a timing cell tracks none), or a peer: a real-rank memory cell
                    res.real_memory[r.strategy] = r
                elif not r.simulated and r.world_size == spec.timing_world_size:
                    res.timing[r.strategy] = r
        if not spec.timing_world_size:
            res.timing = {s: res.memory[s] for s in (BASELINE, OURS, *spec.further) if s in res.memory}
        if res.memory or res.max_size or res.real_memory:
            results.append(res)
    return results


def every_variant(spec: ClaimSpec, found: dict[str, WorkloadResult]) -> list[WorkloadResult]:
    """A result per variant of ``spec``, in report order, from those found by label; a variant
    without one is an empty result (reported as not measured)."""
    return [found.get(w.label) or WorkloadResult(w) for w in spec.variants()]
