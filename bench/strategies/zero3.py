"""``zero3``: our ShardedOptimizer with ``ShardedDataParallel(stage=3)``: optimizer state,
gradients and parameters sharded; each unit (a transformer layer, a ResNet block: the default
unit policy) gathered only while it runs.

Memory accounting, per rank: this rank's parameter chunks and the unit buffers gathered at the
moment are "params" (a gathered buffer *is* the module's parameters, and its size is what
parameter sharding trades against communication), gradient shards "grads", fp32 masters and
AdamW state "optimizer", and the full-gradient buffers waiting for their reduction "other"
(communication buffers, as zero2's buckets)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from bench.strategies.base import OptimizerFactory, RankContext
from bench.strategies.sharded import ShardedDataParallel
from bench.strategies.sharded.stage3 import ShardedDataParallel3
from bench.strategies.sharded_optimizer import ShardedOptimizerStrategy


class Zero3Strategy(ShardedOptimizerStrategy, card="zero3"):
    def __init__(self) -> None:
        super().__init__()
        self.model: ShardedDataParallel | None = None

    def settings(self) -> dict[str, Any]:
        reduction = self.model.reduce if self.model is not None else "all_reduce on gloo, else reduce_scatter"
        units = getattr(self.model, "units", None)
        cap = "bucket_cap_mb"  # buckets follow units here, whatever their size
        return {
            **{k: v for k, v in super().settings().items() if k != cap},
            "partition": "one flat buffer per unit and param group, element-balanced",
            "units": "each parameterised child of an nn.ModuleList/nn.Sequential, then the root",
            "unit_count": len(units) if units is not None else None,
            "prefetch": "one unit ahead in forward and backward; at most two units whole besides the root",
            "max_buckets_in_flight": ShardedDataParallel3.max_in_flight,
            "gradient_reduction": reduction,
            "broadcast_buffers": True,
        }

    def setup(
        self, model: nn.Module, optimizer_factory: OptimizerFactory, ctx: RankContext
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        optimizer = self.build_optimizer(model, optimizer_factory, ctx)
        self.model = ShardedDataParallel(model, optimizer, stage=3)
        return self.model, optimizer

    def teardown(self) -> None:
        """Finish any reduction in flight, remove the hooks, then drop the wrappers."""
        if self.model is not None:
            self.model.close()
            self.model = None
        super().teardown()

    def observe_memory(self, observer: Callable[[torch.Tensor, str], None] | None) -> None:
        if self.model is not None:
            self.model.memory_observer = observer

    def memory_tensors(self) -> dict[str, list[torch.Tensor]]:
        model_tensors = self.model.memory_tensors() if self.model is not None else {}
        return {**super().memory_tensors(), **model_tensors}
