"""``zero1``: our ShardedOptimizer (optimizer state sharded), its gradients reduced to their owners.

Where the backend has a fast reduce-scatter (nccl, and the fake group that plans and simulates),
the model is wrapped in ``ShardedDataParallel(stage=1)``: each gradient bucket is
reduce-scattered to the rank that owns it and the updated parameters are all-gathered, so a step
sends what DDP's all-reduce sends (ZeRO's P_os: 2 Psi). Full gradients stay in the buckets, as
stage 1 keeps them (4 Psi, as DDP's buckets).

On gloo, DistributedDataParallel (configured exactly as the ``ddp`` baseline) all-reduces the
gradients and the optimizer all-gathers the updated parameters, 1.5x DDP's bytes: there it is the
faster of the two (docs/measuring.md, "zero1 on gloo"). Sharded in groups smaller than the world
(``shard_group``), it reduces with our wrapper on gloo too: DDP's all-reduce spans the world.
The ShardedOptimizer is built *before* either wrapper sees the model, because it moves the
parameters into its flat buckets.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardbench.metrics.analytic import Communication
from shardbench.precision import element_bytes
from shardbench.strategies.base import OptimizerFactory, RankContext
from shardbench.strategies.ddp import DDP_SETTINGS, wrap_ddp
from shardbench.strategies.sharded import ShardedDataParallel
from shardbench.strategies.sharded.layout import MAX_IN_FLIGHT
from shardbench.strategies.sharded_optimizer_strategy import ShardedOptimizerStrategy

#: the backends on which zero1 keeps DDP's all-reduce (measured faster there)
DDP_BACKENDS = ("gloo",)


def hybrid(ctx: RankContext) -> bool:
    """Whether the cell shards within groups smaller than the world: DDP's all-reduce spans
    the world, so a hybrid zero1 reduces with our wrapper on every backend."""
    return ctx.shard_group is not None and ctx.shard_group < ctx.world_size


class Zero1Strategy(ShardedOptimizerStrategy, card="zero1"):
    def communication(self, precision: str, backend: str) -> Communication:
        """Gradients reduce-scattered (all-reduced by DDP on gloo; by our reducer where it
        shards in groups), then the updated parameters all-gathered, both in the parameters'
        dtype."""
        size = element_bytes(precision)
        gradients = "all_reduce" if backend in DDP_BACKENDS else "reduce_scatter"
        return Communication(
            gradients=gradients,
            gradient_bytes=size,
            parameters="all_gather",
            parameter_bytes=size,
            grouped_reducer_backend=backend,
            copies_gradients_into_buckets=True,
        )

    def settings(self) -> dict[str, Any]:
        settings = {**super().settings(), "max_buckets_in_flight": MAX_IN_FLIGHT, "broadcast_buffers": True}
        if self.model is not None:
            return {**settings, "gradient_reduction": self.model.reducer.collective}
        return {**settings, "gradient_reduction": "DDP all_reduce (gloo)", "ddp": dict(DDP_SETTINGS)}

    def setup(
        self, model: nn.Module, optimizer_factory: OptimizerFactory, ctx: RankContext
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        optimizer = self.build_optimizer(model, optimizer_factory, ctx)
        if dist.get_backend(ctx.process_group) in DDP_BACKENDS and not hybrid(ctx):
            return wrap_ddp(model, ctx), optimizer
        self.model = ShardedDataParallel(model, optimizer, stage=1, shard_group_size=ctx.shard_group)
        return self.model, optimizer
