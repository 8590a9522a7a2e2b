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
from shardbench.studies.claim_result import (
    MEMORY_THRESHOLD,
    SIZE_THRESHOLD,
    WorkloadResult,
    ratio_text,
    results_from_records,
)
from shardbench.studies.claim_specs import ClaimSpec


@dataclass(frozen=True)
class ClaimChange:
    workload: str
    held_before: bool | None
    holds_now: bool | None
    moved: str
    #: the verdicts as the report words them (``WorkloadResult.outcome``: "undecided" too)
    before: str = ""
    now: str = ""

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
        was = then.outcome(spec.world_size) if then is not None else "not measured"
        changes.append(
            ClaimChange(now.workload.label, held, holds, _moved(then, now), was, now.outcome(spec.world_size))
        )
    return changes


def _moved(then: WorkloadResult | None, now: WorkloadResult) -> str:
    if then is None:
        return "not in the baseline"
    parts = []
    for label, old, new, threshold in (
        ("zero2/ddp peak", then.memory_ratio(), now.memory_ratio(), MEMORY_THRESHOLD),
        ("max-size ratio", then.size_ratio()[0], now.size_ratio()[0], SIZE_THRESHOLD),
    ):
        parts.append(f"{label} {ratio_text(old, threshold)} -> {ratio_text(new, threshold)}")
    return "; ".join(parts)
