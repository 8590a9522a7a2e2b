"""``torch-zero1``: PyTorch's ZeroRedundancyOptimizer with DistributedDataParallel.

The peer most users would pick for optimizer-state sharding. Configured as its documentation
recommends for speed: ``parameters_as_bucket_view=True`` (parameters packed into buckets, one
broadcast per bucket), with DDP at ``gradient_as_bucket_view=True`` like our ``ddp`` baseline.
It partitions whole parameters across ranks (greedily by size), so one large tensor, such as
BERT's word embedding, can leave one rank well above total/N.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from shardbench.metrics.analytic import Communication
from shardbench.strategies.base import OptimizerFactory, RankContext, Strategy
from shardbench.strategies.ddp import DDP_COMMUNICATION, DDP_SETTINGS, wrap_ddp

if TYPE_CHECKING:  # importing it costs ~1 s (TorchScript'd functional optimizers): only when used
    from torch.distributed.optim import ZeroRedundancyOptimizer


class TorchZero1Strategy(Strategy, card="torch-zero1"):
    def __init__(self) -> None:
        self.optimizer: ZeroRedundancyOptimizer | None = None

    def settings(self) -> dict[str, Any]:
        return {
            "parameters_as_bucket_view": True,
            "overlap_with_ddp": False,
            "ddp": dict(DDP_SETTINGS),
            "partition": "whole parameters",
        }

    def communication(self, precision: str, backend: str) -> Communication:
        """DDP's all-reduce, then each updated parameter broadcast from the rank that owns it
        (fp32: autocast keeps fp32 parameters)."""
        return replace(DDP_COMMUNICATION, parameters="broadcast", parameter_bytes=4)

    def setup(
        self, model: nn.Module, optimizer_factory: OptimizerFactory, ctx: RankContext
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        template = optimizer_factory(model)
        groups = [dict(g) for g in template.param_groups]
        from torch.distributed.optim import ZeroRedundancyOptimizer

        self.optimizer = ZeroRedundancyOptimizer(
            groups,
            optimizer_class=type(template),
            process_group=ctx.process_group,
            parameters_as_bucket_view=True,
            lr=template.defaults["lr"],
        )
        return wrap_ddp(model, ctx), self.optimizer

    def memory_tensors(self) -> dict[str, list[torch.Tensor]]:
        if self.optimizer is None:
            return {}
        state = self.optimizer.optim.state
        return {"optimizer": [v for st in state.values() for v in st.values() if torch.is_tensor(v)]}
