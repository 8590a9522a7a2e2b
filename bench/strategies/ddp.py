"""``ddp``: DistributedDataParallel, configured the strong way.

``gradient_as_bucket_view=True`` is DDP's documented memory setting: gradients are views into
the all-reduce buckets, so DDP holds one gradient-sized buffer (16 bytes/parameter of model
state with fp32 AdamW) instead of two (20). A baseline that skipped it would flatter sharding.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bench.strategies.base import OptimizerFactory, RankContext, Strategy

#: how every DDP-based strategy here configures DDP (ddp, zero1, torch-zero1), so they differ
#: only in what they add to it.
DDP_SETTINGS: dict[str, Any] = {
    "gradient_as_bucket_view": True,
    "bucket_cap_mb": 25,
    "broadcast_buffers": True,
}


def wrap_ddp(model: nn.Module, ctx: RankContext) -> DistributedDataParallel:
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(
        model, device_ids=device_ids, process_group=ctx.process_group, **DDP_SETTINGS
    )


class DDPStrategy(Strategy):
    name = "ddp"
    description = "DistributedDataParallel (gradient_as_bucket_view=True), full replicas"

    def settings(self) -> dict[str, Any]:
        return dict(DDP_SETTINGS)

    def setup(
        self, model: nn.Module, optimizer_factory: OptimizerFactory, ctx: RankContext
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        return wrap_ddp(model, ctx), optimizer_factory(model)
