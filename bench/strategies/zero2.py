"""``zero2`` (alias ``sharded`` and ``ddp_sharded``, the name Lightning gave sharded training):
our ShardedOptimizer with ShardedDataParallel: optimizer state and gradients sharded,
parameters replicated."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from shardbench.metrics.analytic import Communication
from shardbench.strategies.base import OptimizerFactory, RankContext
from shardbench.strategies.sharded import ShardedDataParallel
from shardbench.strategies.sharded.reducer import GLOO_REDUCE_FROM, MAX_IN_FLIGHT
from shardbench.strategies.sharded_optimizer import ShardedOptimizerStrategy, element_bytes


class Zero2Strategy(ShardedOptimizerStrategy, card="zero2"):
    #: ZeRO stage of the ShardedDataParallel built (``zero3`` subclasses this with 3)
    stage = 2

    def __init__(self) -> None:
        super().__init__()
        self.model: ShardedDataParallel | None = None

    def communication(self, precision: str, backend: str) -> Communication:
        """Gradients reduce-scattered (on gloo all-reduced in place, or from ``GLOO_REDUCE_FROM``
        ranks on each chunk reduced to its owner: ``default_collective``), then the updated
        parameters all-gathered; zero3 gathers each unit, its frozen parameters included, in
        forward and again in backward, but the root, which stays gathered in between."""
        size = element_bytes(precision)
        gloo = backend == "gloo"
        return Communication(
            gradients="all_reduce" if gloo else "reduce_scatter",
            gradients_from=(GLOO_REDUCE_FROM, "reduce") if gloo else None,
            gradient_bytes=size,
            parameters="all_gather",
            parameter_bytes=size,
            gathers=2 if self.stage == 3 else 1,
            root_kept=self.stage == 3,
            frozen_gathered=self.stage == 3,
        )

    def settings(self) -> dict[str, Any]:
        default = f"on gloo all_reduce, from {GLOO_REDUCE_FROM} ranks reduce to owners; else reduce_scatter"
        reduction = self.model.reducer.collective if self.model is not None else default
        return {
            **super().settings(),
            "max_buckets_in_flight": MAX_IN_FLIGHT,
            "gradient_reduction": reduction,
            "broadcast_buffers": True,
        }

    def setup(
        self, model: nn.Module, optimizer_factory: OptimizerFactory, ctx: RankContext
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        optimizer = self.build_optimizer(model, optimizer_factory, ctx)
        self.model = ShardedDataParallel(model, optimizer, stage=self.stage)
        return self.model, optimizer

    def teardown(self) -> None:
        """Finish any reduction in flight and remove the gradient hooks, then drop the wrappers."""
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
