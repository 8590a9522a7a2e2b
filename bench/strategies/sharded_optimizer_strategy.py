"""What our three ZeRO strategies (zero1, zero2, zero3) share: building our ShardedOptimizer
from the workload's optimizer, bf16 handling, declaring its memory (fp32 master weights), and
holding the ShardedDataParallel that wraps the model (closed at teardown, its buffers declared).
Each stage's strategy is its own small class over these parts: it chooses how the model is
wrapped and what a step sends (``zero1.py``, ``zero2.py``, ``zero3.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from shardbench.metrics.analytic import GLOO_REDUCE_FROM, Communication
from shardbench.precision import compute_dtype, element_bytes, loss_scaled
from shardbench.strategies.base import LossFn, OptimizerFactory, RankContext, Strategy
from shardbench.strategies.sharded import ShardedDataParallel, ShardedGradScaler, ShardedOptimizer

#: how gradients are reduced, as a record states it before a wrapper has chosen (the collective
#: follows the backend and the world size: ``ShardedDataParallel``'s reducer)
DEFAULT_REDUCTION = f"on gloo all_reduce, from {GLOO_REDUCE_FROM} ranks reduce to owners; else reduce_scatter"


class ShardedOptimizerStrategy(Strategy):
    """Base of the strategies built on our ShardedOptimizer: the optimizer, and the
    ShardedDataParallel a subclass wraps the model in (``self.model``; None where it keeps
    another wrapper, as zero1 keeps DDP on gloo)."""

    bucket_cap_mb = 25.0

    def __init__(self) -> None:
        self.optimizer: ShardedOptimizer | None = None
        self.model: ShardedDataParallel | None = None

    def settings(self) -> dict[str, Any]:
        return {"bucket_cap_mb": self.bucket_cap_mb, "partition": "flat buckets, element-balanced"}

    def gradient_reduction(self) -> str:
        """The collective the wrapper reduces gradients with (``DEFAULT_REDUCTION`` before one)."""
        return self.model.reducer.collective if self.model is not None else DEFAULT_REDUCTION

    def model_state_precision(self, precision: str) -> str:
        return precision  # 16-bit parameters and gradients, fp32 master weights (2+2+12)

    def prepare_precision(self, model: nn.Module, precision: str) -> tuple[nn.Module, torch.dtype | None]:
        """16-bit (bf16 or fp16) parameters and gradients; the ShardedOptimizer keeps fp32
        master weights."""
        self.input_dtype = compute_dtype(precision)
        return (cast_floating(model, self.input_dtype) if self.input_dtype is not None else model), None

    def loss_scaler(self, optimizer: Any, ctx: RankContext) -> ShardedGradScaler | None:
        """fp16: our ``ShardedGradScaler``, which unscales the shards the optimizer owns and
        agrees on an overflow over its group (torch's scaler sees no gradient of ours)."""
        return ShardedGradScaler(ctx.device.type) if loss_scaled(ctx.precision) else None

    def train_step(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, inputs: Any, loss_fn: LossFn
    ) -> torch.Tensor:
        """As every strategy's, with floating inputs in the parameters' 16-bit dtype: no autocast runs
        over bf16 parameters to cast them (an image batch met a bf16 convolution as fp32:
        "Input type (float) and bias type (c10::BFloat16) should be the same")."""
        dtype = getattr(self, "input_dtype", None)
        if dtype is not None and isinstance(inputs, dict):
            inputs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
        return super().train_step(model, optimizer, inputs, loss_fn)

    def build_optimizer(
        self, model: nn.Module, optimizer_factory: OptimizerFactory, ctx: RankContext
    ) -> ShardedOptimizer:
        """Must run before any wrapper sees the model: it moves parameters into flat buckets."""
        self.optimizer = ShardedOptimizer.from_optimizer(
            optimizer_factory(model), process_group=ctx.process_group, bucket_cap_mb=self.bucket_cap_mb
        )
        return self.optimizer

    def observe_memory(self, observer: Callable[[torch.Tensor, str], None] | None) -> None:
        if self.model is not None:
            self.model.memory_observer = observer

    def memory_tensors(self) -> dict[str, list[torch.Tensor]]:
        optimizer_tensors = self.optimizer.memory_tensors() if self.optimizer is not None else {}
        model_tensors = self.model.memory_tensors() if self.model is not None else {}
        return {**optimizer_tensors, **model_tensors}

    def teardown(self) -> None:
        """Finish any reduction in flight and remove the gradient hooks, then drop the wrapper
        and the optimizer: the worker destroys the process group next (our objects never hold
        the default group, but a caller-provided one they do)."""
        if self.model is not None:
            self.model.close()
            self.model = None
        self.optimizer = None


def reduced_then_gathered(
    precision: str, backend: str, *, gathers: int = 1, root_kept: bool = False, frozen_gathered: bool = False
) -> Communication:
    """What a ShardedDataParallel step sends: gradients reduced by its reducer's collective on
    ``backend`` (``analytic.sharded_gradient_collective``), then the parameters all-gathered,
    ``gathers`` times a step, both in the parameters' dtype (bf16 parameters and gradients in a
    bf16 run). Gathered per unit (more than once a step), each unit's flat buffer is allocated
    at its gather and freed after (``sharded/gatherer.py``); gathered once, after the step, into
    buffers kept across steps. Each gradient is copied into its bucket's buffer as it is ready
    (``sharded/reducer.py``)."""
    size = element_bytes(precision)
    return Communication(
        reducer_backend=backend,
        gradient_bytes=size,
        parameters="all_gather",
        parameter_bytes=size,
        gathers=gathers,
        root_kept=root_kept,
        frozen_gathered=frozen_gathered,
        gathers_into_fresh_memory=gathers > 1,
        copies_gradients_into_buckets=True,
    )


def cast_floating(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """``model.to(dtype)`` for its floating-point parameters and buffers, in place (the same
    Parameter objects, as ``Module.to`` keeps them for plain tensors). Written out because under
    FakeTensorMode (``--fake``) ``Module.to`` swaps each parameter for a new tensor subclass
    instance and fails on one still referenced elsewhere ("_apply(): Couldn't swap
    Embedding.weight"), which made every bf16 zero1/zero2 plan an error."""
    for module in model.modules():
        for param in module.parameters(recurse=False):
            if param.is_floating_point():
                param.data = param.data.to(dtype)
        for name, buffer in module.named_buffers(recurse=False):
            if buffer.is_floating_point():
                module._buffers[name] = buffer.to(dtype)
    return model
