"""``claim --baseline NAME``: the claim as a regression gate.

A workload whose claim held in the baseline (zero2's peak <= 0.5x ddp's, or its largest
trainable model >= 2x) and no longer holds is a regression: ``claim`` exits 1 and the report
says which ratio moved, from what to what. The baseline's verdicts are recomputed from its
records by the same rule (``WorkloadResult.verdict``), never read from an old report's text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardbench.records import Record
from shardbench.studies.claim import BASELINE, OURS, WorkloadResult
from shardbench.studies.claim_specs import ClaimSpec


def results_from_records(spec: ClaimSpec, records: Sequence[Record]) -> list[WorkloadResult]:
    """The claim's per-workload results rebuilt from its records (the last record of each role
    wins, as in a run that repeated a cell); workloads with no record are left out."""
    results = []
    for w in spec.variants():
        res = WorkloadResult(w)
        for r in records:
            if r.workload != w.name or bool(r.activation_checkpointing) != w.activation_checkpointing:
                continue
            if r.max_size is not None:
                res.max_size[r.strategy] = r
            elif r.suite == f"claim-{spec.name}" and r.preset == w.preset and not r.fake:
                if r.simulated and r.world_size == spec.world_size:
                    res.memory[r.strategy] = r
                elif (
                    not r.simulated
                    and r.world_size == spec.timing_world_size
                    and (r.peak_mem_bytes or r.strategy not in (BASELINE, OURS))
                ):  # memory tracked (a timing cell tracks none), or a peer: a real-rank memory cell
                    res.real_memory[r.strategy] = r
                elif not r.simulated and r.world_size == spec.timing_world_size:
                    res.timing[r.strategy] = r
        if not spec.timing_world_size:
            res.timing = {s: res.memory[s] for s in (BASELINE, OURS) if s in res.memory}
        if res.memory or res.max_size or res.real_memory:
            results.append(res)
    return results


@dataclass(frozen=True)
class ClaimChange:
    workload: str
    held_before: bool | None
    holds_now: bool | None
    moved: str

    @property
    def regressed(self) -> bool:
        return self.held_before is True and self.holds_now is not True


def compare_claims(
    spec: ClaimSpec, baseline: Sequence[Record], current: Sequence[WorkloadResult]
) -> list[ClaimChange]:
    before = {r.workload.label: r for r in results_from_records(spec, baseline)}
    changes = []
    for now in current:
        then = before.get(now.workload.label)
        held = then.verdict(spec.world_size)[0] if then is not None else None
        holds = now.verdict(spec.world_size)[0]
        changes.append(ClaimChange(now.workload.label, held, holds, _moved(then, now)))
    return changes


def _moved(then: WorkloadResult | None, now: WorkloadResult) -> str:
    if then is None:
        return "not in the baseline"
    parts = []
    for label, old, new in (
        ("zero2/ddp peak", then.memory_ratio(), now.memory_ratio()),
        ("max-size ratio", then.size_ratio()[0], now.size_ratio()[0]),
    ):
        parts.append(f"{label} {_fmt(old)} -> {_fmt(new)}")
    return "; ".join(parts)


def _fmt(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f}x"


def gate_section(name: str, changes: Sequence[ClaimChange]) -> str:
    word = {True: "holds", False: "does not hold", None: "not measured"}
    lines = [f"## Against baseline `{name}`", ""]
    for c in changes:
        flag = " - REGRESSED" if c.regressed else ""
        lines.append(f"- {c.workload}: {word[c.held_before]} -> {word[c.holds_now]}{flag} ({c.moved})")
    return "\n".join(lines) + "\n"
