"""``zero3``: our ShardedOptimizer with ``ShardedDataParallel(stage=3)``: optimizer state,
gradients and parameters sharded; each unit (a transformer layer, a ResNet block: the default
unit policy) gathered only while it runs.

Memory accounting, per rank: this rank's parameter chunks and the unit buffers gathered at the
moment are "params" (a gathered buffer *is* the module's parameters, and its size is what
parameter sharding trades against communication), gradient shards "grads", fp32 masters and
AdamW state "optimizer", and the full-gradient buffers waiting for their reduction "comm"
(communication buffers, as zero2's buckets)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from shardbench.metrics.analytic import Communication
from shardbench.strategies.base import OptimizerFactory, RankContext
from shardbench.strategies.sharded import ShardedDataParallel
from shardbench.strategies.sharded.layout import UNIT_IN_FLIGHT
from shardbench.strategies.sharded.units import UnitPolicy
from shardbench.strategies.sharded_optimizer_strategy import ShardedOptimizerStrategy, reduced_then_gathered

DEFAULT_UNITS = "each parameterised child of an nn.ModuleList/nn.Sequential, then the root"


class Zero3Strategy(ShardedOptimizerStrategy, card="zero3"):
    def __init__(self) -> None:
        super().__init__()
        self.units = DEFAULT_UNITS

    def communication(self, precision: str, backend: str) -> Communication:
        """As zero2's, but each unit is gathered in forward and again in backward (its frozen
        parameters too), except the root, which stays gathered in between."""
        return reduced_then_gathered(precision, backend, gathers=2, root_kept=True, frozen_gathered=True)

    def setup(
        self, model: nn.Module, optimizer_factory: OptimizerFactory, ctx: RankContext
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The default units, or the workload's (``Workload.shard_units``) where it names them."""
        policy: UnitPolicy | None = None
        if ctx.shard_units is not None:
            chosen = {id(m) for m in ctx.shard_units}
            policy = lambda module: id(module) in chosen  # noqa: E731
            self.units = "the workload's units (Workload.shard_units), then the root"
        optimizer = self.build_optimizer(model, optimizer_factory, ctx)
        self.model = ShardedDataParallel(
            model, optimizer, stage=3, unit=policy, shard_group_size=ctx.shard_group
        )
        return self.model, optimizer

    def settings(self) -> dict[str, Any]:
        units = getattr(self.model, "units", None)
        return {
            "partition": "one flat buffer per unit and param group, element-balanced",
            "max_buckets_in_flight": UNIT_IN_FLIGHT,
            "gradient_reduction": self.gradient_reduction(),
            "broadcast_buffers": True,
            "units": self.units,
            "unit_count": len(units) if units is not None else None,
            "prefetch": "one unit ahead in forward and backward; at most two units whole besides the root",
        }
