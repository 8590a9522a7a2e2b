"""``dp``: torch.nn.DataParallel, the single-process multi-GPU baseline.

DataParallel only parallelises across two or more CUDA devices; on CPU or on one GPU it is a
silent pass-through (no scatter, no replicas). So a request for N devices is planned honestly:
with >= 2 GPUs it drives min(N, GPUs) of them; otherwise it runs single-device and the record
says ``world_size: 1`` with a note, never pretending to be N devices.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from shardbench.strategies.base import OptimizerFactory, RankContext, Strategy, WorldPlan
from shardbench.wording import count


class DPStrategy(Strategy, card="dp"):
    def plan_world(
        self, requested: int, device_type: str, simulate: bool = False, *, devices: int | None = None
    ) -> WorldPlan:
        # one process driving this host's GPUs: ``devices`` (a job's processes) are not its to use
        if simulate:
            raise ValueError(
                "strategy 'dp' cannot be simulated: DataParallel is one process driving "
                "local GPUs, with no process group to fake; use --simulate with ddp or a "
                "sharded strategy"
            )
        gpus = torch.cuda.device_count() if device_type == "cuda" and torch.cuda.is_available() else 0
        if gpus >= 2:
            used = min(requested, gpus)
            asked = count(requested, "device")
            note = "" if used == requested else f"requested {asked}, {gpus} visible: used {used}"
            return WorldPlan(processes=1, world_size=used, note=note)
        note = (
            ""
            if requested == 1
            else f"DataParallel is a pass-through on {'one GPU' if gpus == 1 else 'CPU'}: "
            f"requested world size {requested}, ran single-device"
        )
        return WorldPlan(processes=1, world_size=1, note=note)

    def settings(self) -> dict[str, Any]:
        return {}

    def setup(
        self, model: nn.Module, optimizer_factory: OptimizerFactory, ctx: RankContext
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        optimizer = optimizer_factory(model)
        if ctx.device.type == "cuda" and ctx.world_size >= 2:
            model = nn.DataParallel(model, device_ids=list(range(ctx.world_size)))
        return model, optimizer
