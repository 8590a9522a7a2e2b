"""The FairScale peers built on its sharded optimizer, ``OSS``: ``fairscale-zero1`` (OSS + DDP)
and ``fairscale-zero2`` (OSS + ``ShardedDataParallel``, the implementation Lightning's
``ddp_sharded`` wrapped, behind the claim this suite reproduces).

Configured as FairScale's documentation and Lightning's ``ddp_sharded`` did: the workload's
optimizer class and parameter groups handed to ``OSS`` (``OSS(groups, optim=AdamW, **defaults)``),
which partitions whole parameters across ranks (greedily by size) and broadcasts each updated
shard from its owner. ``fairscale-zero1`` keeps DDP's all-reduce (``DDP_SETTINGS``, as our
``ddp``); ``fairscale-zero2`` reduces each gradient to the rank that owns it and frees it
elsewhere, with ``reduce_buffer_size=0``: FairScale 0.4.13's reduce buckets give wrong gradients
on this torch (the catalog's deviation; tested in ``tests/test_peer_parity.py``).
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import torch
from torch import nn

from shardbench.metrics.analytic import Communication
from shardbench.precision import loss_scaled
from shardbench.strategies.base import OptimizerFactory, RankContext, Strategy
from shardbench.strategies.ddp import DDP_SETTINGS, wrap_ddp

#: ShardedDataParallel's reduce buckets, in elements: off (see the module docstring)
REDUCE_BUFFER_SIZE = 0


def sharded_optimizer(model: nn.Module, optimizer_factory: OptimizerFactory, ctx: RankContext) -> Any:
    """FairScale's OSS over the workload's optimizer class, groups and hyperparameters."""
    try:
        from fairscale.optim.oss import OSS
    except ImportError as e:  # validation names the extra first; this is for direct use
        raise RuntimeError("fairscale is not installed: install shardbench's 'peers' extra") from e
    template = optimizer_factory(model)
    groups = [dict(g) for g in template.param_groups]
    # defaults the constructor takes (AdamW's ``defaults`` also hold keys it derives, such as
    # decoupled_weight_decay, that its __init__ refuses); each group carries its own values anyway
    accepted = inspect.signature(type(template)).parameters
    defaults = {k: v for k, v in template.defaults.items() if k in accepted}
    return OSS(groups, optim=type(template), group=ctx.process_group, **defaults)


#: how OSS is configured: its defaults, which its documentation recommends. Its "broadcast
#: buckets" are per-owner flat buffers the parameters are views of (``broadcast_buffer_size`` is
#: deprecated and unused in 0.4.13); ``broadcast_fp16`` stays off, as its docs advise without AMP
OSS_SETTINGS = {
    "optim": "torch.optim.AdamW (the workload's hyperparameters)",
    "broadcast_buckets": "one flat buffer per owning rank (parameters are views of it)",
    "broadcast_fp16": False,
}


class FairScaleOSSStrategy(Strategy):
    """Shared: the optimizer and what it holds; a subclass chooses the gradient reduction."""

    sharded_gradients: ClassVar[bool]

    def __init__(self) -> None:
        self.optimizer: Any = None

    def communication(self, precision: str, backend: str) -> Communication:
        """Gradients all-reduced by DDP (zero1) or each reduced to the rank that owns it
        (ShardedDataParallel), then each updated parameter broadcast from its owner; fp32
        parameters (autocast), so 4 bytes an element either way."""
        gradients = "reduce" if self.sharded_gradients else "all_reduce"
        return Communication(
            gradients=gradients,
            gradient_bytes=4,
            parameters="broadcast",
            parameter_bytes=4,
            copies_gradients_into_buckets=not self.sharded_gradients,  # ShardedDDP: buckets off
        )

    def loss_scaler(self, optimizer: Any, ctx: RankContext) -> Any:
        """FairScale's ``ShardedGradScaler``, which it documents for OSS and ShardedDDP at fp16:
        the overflow check of each rank's own parameters agreed over the process group."""
        return fairscale_scaler(ctx)

    def memory_tensors(self) -> dict[str, list[torch.Tensor]]:
        """OSS's inner optimizer holds the state of this rank's parameters (a torch Optimizer,
        typed by the tracker too); listed so a version that wraps it differently stays typed."""
        if self.optimizer is None:
            return {}
        state = self.optimizer.optim.state
        return {"optimizer": [t for st in state.values() for t in st.values() if torch.is_tensor(t)]}


class FairScaleZero1Strategy(FairScaleOSSStrategy, card="fairscale-zero1"):
    sharded_gradients = False

    def settings(self) -> dict[str, Any]:
        import fairscale

        return {"fairscale": fairscale.__version__, "optimizer": OSS_SETTINGS, "ddp": dict(DDP_SETTINGS)}

    def setup(
        self, model: nn.Module, optimizer_factory: OptimizerFactory, ctx: RankContext
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        self.optimizer = sharded_optimizer(model, optimizer_factory, ctx)
        return wrap_ddp(model, ctx), self.optimizer


class FairScaleZero2Strategy(FairScaleOSSStrategy, card="fairscale-zero2"):
    sharded_gradients = True

    def settings(self) -> dict[str, Any]:
        import fairscale

        return {
            "fairscale": fairscale.__version__,
            "optimizer": OSS_SETTINGS,
            "sharded_ddp": {"reduce_buffer_size": REDUCE_BUFFER_SIZE, "broadcast_buffers": True},
        }

    def setup(
        self, model: nn.Module, optimizer_factory: OptimizerFactory, ctx: RankContext
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        from fairscale.nn.data_parallel import ShardedDataParallel

        self.optimizer = sharded_optimizer(model, optimizer_factory, ctx)
        wrapped = ShardedDataParallel(
            model, self.optimizer, process_group=ctx.process_group, reduce_buffer_size=REDUCE_BUFFER_SIZE
        )
        return wrapped, self.optimizer


def fairscale_scaler(ctx: RankContext) -> Any:
    """FairScale's ``ShardedGradScaler`` over the rank's process group at fp16, else None. It
    runs only where CUDA is (without it the scaler disables itself and would train fp16
    unscaled), which validation refuses on the CPU before a cell starts
    (``StrategyCard.fp16_needs_cuda``)."""
    if not loss_scaled(ctx.precision):
        return None
    from fairscale.optim.grad_scaler import ShardedGradScaler

    return ShardedGradScaler(process_group=ctx.process_group)
