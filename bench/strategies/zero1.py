"""``zero1``: our ShardedOptimizer (optimizer state sharded) with DistributedDataParallel.

DDP all-reduces full gradients (configured exactly as the ``ddp`` baseline); the optimizer state
lives only for each rank's chunk. The ShardedOptimizer is built *before* DDP wraps the model,
because it moves the parameters into its flat buckets and DDP should see their final storage.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bench.strategies.base import OptimizerFactory, RankContext
from bench.strategies.ddp import DDP_SETTINGS, wrap_ddp
from bench.strategies.sharded_optimizer import ShardedOptimizerStrategy


class Zero1Strategy(ShardedOptimizerStrategy, card="zero1"):
    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "ddp": dict(DDP_SETTINGS)}

    def setup(
        self, model: nn.Module, optimizer_factory: OptimizerFactory, ctx: RankContext
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        optimizer = self.build_optimizer(model, optimizer_factory, ctx)
        return wrap_ddp(model, ctx), optimizer
