"""``ddp``: DistributedDataParallel, configured the strong way.

``gradient_as_bucket_view=True`` is DDP's documented memory setting: gradients are views into
the all-reduce buckets, so DDP holds one gradient-sized buffer (16 bytes/parameter of model
state with fp32 AdamW) instead of two (20). A baseline that skipped it would flatter sharding.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from shardbench.metrics.analytic import Communication
from shardbench.strategies.base import OptimizerFactory, RankContext, Strategy
from shardbench.strategies.ddp_planned import PlannedDDP
from shardbench.strategies.sharded.fake import is_fake

#: how every DDP-based strategy here configures DDP (ddp, zero1, torch-zero1), so they differ
#: only in what they add to it.
DDP_SETTINGS: dict[str, Any] = {
    "gradient_as_bucket_view": True,
    "bucket_cap_mb": 25,
    "broadcast_buffers": True,
}


def wrap_ddp(model: nn.Module, ctx: RankContext) -> nn.Module:
    """DDP as configured by ``DDP_SETTINGS``; under ``--fake`` its planned equivalent."""
    if any(is_fake(p) for p in model.parameters()):
        return PlannedDDP(
            model,
            bucket_cap_mb=DDP_SETTINGS["bucket_cap_mb"],
            gradient_as_bucket_view=DDP_SETTINGS["gradient_as_bucket_view"],
        )
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    ddp = DistributedDataParallel(
        model, device_ids=device_ids, process_group=ctx.process_group, **DDP_SETTINGS
    )
    if dist.get_backend(ctx.process_group) == "fake":
        # Under the fake process group DDP's default all-reduce hook returns nothing; this hook
        # issues the bucket's all-reduce (the fake group moves no data, but the collective is
        # counted, bench/metrics/comm.py) and hands the bucket back: DDP's memory, its traffic.
        ddp.register_comm_hook(ctx.process_group, _fake_all_reduce)
    return ddp


def _fake_all_reduce(state, bucket):  # noqa: ANN001 - DDP checks the real (unstringified) annotations
    dist.all_reduce(bucket.buffer(), group=state)
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


#: DDP all-reduces the gradients, fp32 at either precision (bf16 is autocast over fp32 parameters),
#: each copied into its bucket as it is ready
DDP_COMMUNICATION = Communication(
    gradients="all_reduce", gradient_bytes=4, copies_gradients_into_buckets=True
)


class DDPStrategy(Strategy, card="ddp"):
    def settings(self) -> dict[str, Any]:
        return dict(DDP_SETTINGS)

    def communication(self, precision: str, backend: str) -> Communication:
        return DDP_COMMUNICATION

    def setup(
        self, model: nn.Module, optimizer_factory: OptimizerFactory, ctx: RankContext
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        return wrap_ddp(model, ctx), optimizer_factory(model)
