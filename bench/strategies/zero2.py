"""``zero2`` (alias ``sharded`` and ``ddp_sharded``, the name Lightning gave sharded training):
our ShardedOptimizer with ShardedDataParallel: optimizer state and gradients sharded,
parameters replicated."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from shardbench.metrics.analytic import Communication
from shardbench.strategies.base import OptimizerFactory, RankContext
from shardbench.strategies.sharded import ShardedDataParallel
from shardbench.strategies.sharded.layout import MAX_IN_FLIGHT
from shardbench.strategies.sharded_optimizer_strategy import ShardedOptimizerStrategy, reduced_then_gathered


class Zero2Strategy(ShardedOptimizerStrategy, card="zero2"):
    def communication(self, precision: str, backend: str) -> Communication:
        """Gradients reduce-scattered to their owners, then the updated parameters all-gathered
        once."""
        return reduced_then_gathered(precision, backend)

    def settings(self) -> dict[str, Any]:
        return {
            **super().settings(),
            "max_buckets_in_flight": MAX_IN_FLIGHT,
            "gradient_reduction": self.gradient_reduction(),
            "broadcast_buffers": True,
        }

    def setup(
        self, model: nn.Module, optimizer_factory: OptimizerFactory, ctx: RankContext
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        optimizer = self.build_optimizer(model, optimizer_factory, ctx)
        self.model = ShardedDataParallel(model, optimizer, stage=2, shard_group_size=ctx.shard_group)
        return self.model, optimizer
