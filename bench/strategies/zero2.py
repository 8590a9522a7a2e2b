"""``zero2`` (alias ``sharded``, the seed's ``ddp_sharded``): our ShardedOptimizer with
ShardedDataParallel: optimizer state and gradients sharded, parameters replicated."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from bench.strategies.base import OptimizerFactory, RankContext, Strategy
from bench.strategies.sharded import ShardedDataParallel, ShardedOptimizer


class Zero2Strategy(Strategy):
    name = "zero2"
    aliases = ("sharded", "ddp_sharded")
    description = "ours: ShardedOptimizer + ShardedDataParallel (ZeRO-2, element-balanced)"
    shards_optimizer_state = True
    shards_gradients = True
    bucket_cap_mb = 25.0

    def __init__(self) -> None:
        self.optimizer: ShardedOptimizer | None = None
        self.model: ShardedDataParallel | None = None

    def settings(self) -> dict[str, Any]:
        return {
            "bucket_cap_mb": self.bucket_cap_mb,
            "max_buckets_in_flight": 2,
            "broadcast_buffers": True,
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
        self.model = ShardedDataParallel(model, self.optimizer)
        return self.model, self.optimizer

    def observe_memory(self, observer: Callable[[torch.Tensor, str], None] | None) -> None:
        if self.model is not None:
            self.model.memory_observer = observer

    def memory_tensors(self) -> dict[str, list[torch.Tensor]]:
        if self.optimizer is None or self.model is None:
            return {}
        return {**self.optimizer.memory_tensors(), **self.model.memory_tensors()}
