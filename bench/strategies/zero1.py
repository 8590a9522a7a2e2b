"""``zero1``: our ShardedOptimizer (optimizer state sharded) with DistributedDataParallel.

DDP all-reduces full gradients (configured as the ``ddp`` baseline is, with
``gradient_as_bucket_view=True``); the optimizer state lives only for each rank's chunk. The
ShardedOptimizer is built *before* DDP wraps the model, because it moves the parameters into
its flat buckets and DDP should see their final storage.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bench.strategies.base import OptimizerFactory, RankContext, Strategy
from bench.strategies.sharded import ShardedOptimizer


class Zero1Strategy(Strategy):
    name = "zero1"
    description = "ours: ShardedOptimizer (ZeRO-1, element-balanced) + DDP"
    shards_optimizer_state = True
    bucket_cap_mb = 25.0

    def __init__(self) -> None:
        self.optimizer: ShardedOptimizer | None = None

    def settings(self) -> dict[str, Any]:
        return {
            "bucket_cap_mb": self.bucket_cap_mb,
            "ddp_gradient_as_bucket_view": True,
            "partition": "flat buckets, element-balanced",
        }

    def prepare_precision(self, model: nn.Module, precision: str) -> tuple[nn.Module, bool]:
        """bf16 parameters and gradients; the ShardedOptimizer keeps fp32 master weights."""
        return (model.to(torch.bfloat16) if precision == "bf16" else model), False

    def setup(
        self, model: nn.Module, optimizer_factory: OptimizerFactory, ctx: RankContext
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        self.optimizer = ShardedOptimizer.from_optimizer(
            optimizer_factory(model), process_group=ctx.process_group, bucket_cap_mb=self.bucket_cap_mb
        )
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        ddp = DistributedDataParallel(
            model,
            device_ids=device_ids,
            process_group=ctx.process_group,
            gradient_as_bucket_view=True,
            bucket_cap_mb=25,
        )
        return ddp, self.optimizer

    def memory_tensors(self) -> dict[str, list[torch.Tensor]]:
        return self.optimizer.memory_tensors() if self.optimizer is not None else {}
