"""What each of our ZeRO stages shards, declared once: the one place where stages differ.

Every part reads the plan, never a stage number. A stage shards the optimizer state (all three),
then the reduced gradients (2 and 3: each rank keeps only its chunk's), then the parameters
(3: each unit gathered when it runs, freed after). What follows from that is here too: how the
reducer keeps gradients, how many reductions may be in flight, and whether the used-parameter
flags ride in the last bucket's reduction.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardbench.strategies.sharded.layout import MAX_IN_FLIGHT, UNIT_IN_FLIGHT


@dataclass(frozen=True)
class StagePlan:
    """What a ZeRO stage shards across the ranks of its group."""

    stage: int
    #: reduced gradients kept only as this rank's chunk (else whole, as DDP keeps its buckets)
    gradients: bool
    #: parameters kept only as this rank's chunk between uses, gathered unit by unit
    parameters: bool
    #: optimizer state and fp32 master weights kept only for this rank's chunk: every stage
    optimizer_state: bool = True

    @property
    def label(self) -> str:
        """The stage as profiler labels and settings name it: ``zero2``."""
        return f"zero{self.stage}"

    @property
    def keep(self) -> str:
        """What the reducer keeps of a reduced bucket: its ``"shards"`` or the ``"full"`` buffer."""
        return "shards" if self.gradients else "full"

    @property
    def max_in_flight(self) -> int:
        """Reductions in flight at once: buckets sized by the cap, or whole units (stage 3)."""
        return UNIT_IN_FLIGHT if self.parameters else MAX_IN_FLIGHT

    @property
    def folds_flags(self) -> bool:
        """Whether the used-parameter flags may ride in the last bucket's reduction: where
        buckets are reduced by the cap, in bucket order, and kept as shards (stage 2)."""
        return self.gradients and not self.parameters


STAGE_PLANS: dict[int, StagePlan] = {
    1: StagePlan(1, gradients=False, parameters=False),
    2: StagePlan(2, gradients=True, parameters=False),
    3: StagePlan(3, gradients=True, parameters=True),
}


def stage_plan(stage: int) -> StagePlan:
    """The plan of ``stage``; ValueError in one line for anything but 1, 2 or 3."""
    plan = STAGE_PLANS.get(stage) if isinstance(stage, int) and not isinstance(stage, bool) else None
    if plan is None:
        raise ValueError(f"ShardedDataParallel stage must be 1, 2 or 3, got {stage!r}")
    return plan
