"""The DeepSpeed peers: ``deepspeed-zero1``, ``-zero2`` and ``-zero3``, DeepSpeed's engine with
``zero_optimization.stage`` set, over the workload's own ``torch.optim.AdamW`` (the same
optimizer math as every other strategy; ``zero_allow_untested_optimizer``).

Configured as DeepSpeed's ZeRO documentation recommends for speed: ``overlap_comm``,
``contiguous_gradients`` and ``reduce_scatter`` on, its default 500M-element reduce and
all-gather buckets (capped at the model's size: ``deepspeed_config``), and for stage 3 its
default persistence threshold; bf16 runs
through its ``bf16`` section (16-bit parameters over fp32 master partitions). Two of its
defaults would change the math, so they are set: ``gradient_clipping`` is 0 (DeepSpeed clips to
1.0 unless told; no other strategy here clips) and no learning-rate scheduler.

The engine is the model the harness trains (its forward is the module's); a step is
``engine.backward(loss)`` then ``engine.step()``, which clears gradients itself. It joins the
process group the harness made (``deepspeed.init_distributed`` over an initialised group).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn

from shardbench.metrics.analytic import Communication
from shardbench.precision import element_bytes
from shardbench.strategies.base import LossFn, OptimizerFactory, PhaseClock, RankContext, Strategy

#: DeepSpeed's own bucket defaults (elements), written out so every record states them
BUCKET_ELEMENTS = 500_000_000
#: DeepSpeed refuses a bucket that is not a multiple of its NCCL start alignment (2 elements);
#: a model's size capped bucket is rounded up to it
BUCKET_ALIGNMENT = 2


def deepspeed_config(
    stage: int, precision: str, micro_batch: int, num_params: int, clip: float = 0.0
) -> dict[str, Any]:
    """The engine's configuration for ``stage`` at ``precision`` for a model of ``num_params``
    (see the module docstring). Buckets are DeepSpeed's default, capped at the model's size:
    DeepSpeed allocates a reduce bucket's full size up front, so a 500M-element bucket would add
    2 GB of fp32 to a model a thousandth of that, an artefact no user would keep; from 500M
    parameters up the cap is DeepSpeed's default itself. A capped bucket is rounded up to
    ``BUCKET_ALIGNMENT``."""
    bucket = min(BUCKET_ELEMENTS, -(-max(1, num_params) // BUCKET_ALIGNMENT) * BUCKET_ALIGNMENT)
    zero: dict[str, Any] = {
        "stage": stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": bucket,
    }
    if stage < 3:
        zero |= {"reduce_scatter": True, "allgather_partitions": True, "allgather_bucket_size": bucket}
    else:
        zero |= {"stage3_prefetch_bucket_size": bucket}
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": clip,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":  # dynamic loss scaling (loss_scale 0), DeepSpeed's recommended fp16
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    return config


def deepspeed_estimate(stage: int, model: nn.Module, world_size: int) -> dict[str, Any] | None:
    """DeepSpeed's own estimate of the model states one device holds, for ``model`` over
    ``world_size`` devices on one node without offload: ``estimate_zero2_model_states_mem_needs``
    (stage 2) or ``estimate_zero3_model_states_mem_needs`` (stage 3, ``zero_init`` on, its
    default). DeepSpeed has no stage-1 estimator: None. Its formulas assume 16-bit parameters
    and gradients over fp32 master weights and Adam moments (2 + 18/N bytes a parameter at
    stage 2) whatever precision the run trains in; the record says so beside the figure."""
    if stage not in (2, 3):
        return None
    from deepspeed.runtime.zero import stage3, stage_1_and_2

    # as DeepSpeed's own *_all_live helpers count them: a tied weight once, and the largest
    # layer as the most parameters one module holds directly
    total = sum({p.data_ptr(): p.numel() for p in model.parameters()}.values())
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    common = {"num_gpus_per_node": world_size, "num_nodes": 1, "cpu_offload": False}
    if stage == 2:
        function = "estimate_zero2_model_states_mem_needs"
        _, gpu = stage_1_and_2.estimate_zero2_model_states_mem_needs(total, **common)
        args: dict[str, Any] = {"total_params": total, **common}
    else:
        function = "estimate_zero3_model_states_mem_needs"
        _, gpu, _ = stage3.estimate_zero3_model_states_mem_needs(total, largest, **common)
        args = {"total_params": total, "largest_layer_params": largest, **common}
    return {
        "by": f"deepspeed.runtime.zero.{function}",
        "args": args,
        "model_state_bytes": int(gpu),
        "assumes": "16-bit parameters and gradients, fp32 master weights and Adam moments",
    }


class DeepSpeedZeroStrategy(Strategy):
    """Shared set-up; a subclass only chooses the stage."""

    stage: ClassVar[int]
    #: the per-rank micro-batch the config must declare; DeepSpeed uses it only for its own
    #: throughput logging (off here), the harness feeds each cell's batch
    micro_batch = 1

    def __init__(self) -> None:
        self.engine: Any = None
        self.config: dict[str, Any] | None = None
        self.estimate: dict[str, Any] | None = None
        self._unwrapped: dict[str, Any] = {}

    def settings(self) -> dict[str, Any]:
        import deepspeed

        config = self.config or deepspeed_config(self.stage, "fp32", self.micro_batch, BUCKET_ELEMENTS)
        client = "torch.optim.AdamW (the workload's, passed to the engine)"
        settings = {"deepspeed": deepspeed.__version__, "config": config, "optimizer": client}
        if self.estimate is not None:
            settings["peer_estimate"] = self.estimate
        return settings

    def communication(self, precision: str, backend: str) -> Communication:
        """Stages 1-2: the gradients all-reduced in buckets (DeepSpeed's ``reduce_scatter``
        path reduces each bucket with one all-reduce, its default multi-rank bucket all-reduce),
        then the updated partitions all-gathered. Stage 3: each parameter gathered in forward
        and again in backward, the gradients reduce-scattered. 16-bit in bf16 (its bf16 section
        keeps 16-bit parameters and gradients, as does its fp16 section), else fp32. Each
        gradient is copied into its reduction bucket (the engine's ``ipg`` buffer)."""
        size = element_bytes(precision)
        if self.stage == 3:
            return Communication(
                gradients="reduce_scatter",
                gradient_bytes=size,
                parameters="all_gather",
                parameter_bytes=size,
                gathers=2,
                copies_gradients_into_buckets=True,
            )
        return Communication(
            gradients="all_reduce",
            gradient_bytes=size,
            parameters="all_gather",
            parameter_bytes=size,
            copies_gradients_into_buckets=True,
        )

    def prepare_precision(self, model: nn.Module, precision: str) -> tuple[nn.Module, torch.dtype | None]:
        return model, None  # the engine casts to 16-bit itself (its bf16/fp16 section), no autocast

    def loss_scaler(self, optimizer: Any, ctx: RankContext) -> None:
        return None  # its fp16 section scales the loss inside engine.backward

    def model_state_precision(self, precision: str) -> str:
        return precision

    def setup(
        self, model: nn.Module, optimizer_factory: OptimizerFactory, ctx: RankContext
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        try:
            import deepspeed
        except ImportError as e:  # validation names the extra first; this is for direct use
            raise RuntimeError("deepspeed is not installed: install shardbench's 'peers' extra") from e
        os.environ.setdefault("LOCAL_RANK", str(ctx.rank))
        deepspeed.init_distributed(dist_backend="nccl" if ctx.device.type == "cuda" else "gloo")
        num_params = sum(p.numel() for p in model.parameters())
        self.config = self.engine_config(ctx, num_params)
        self.estimate = deepspeed_estimate(self.stage, model, ctx.world_size)
        engine, optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer_factory(model), config=self.config
        )
        self.engine = engine
        return engine, optimizer

    def engine_config(self, ctx: RankContext, num_params: int) -> dict[str, Any]:
        """The engine's configuration for this rank's cell (``deepspeed_config``)."""
        return deepspeed_config(self.stage, ctx.precision, self.micro_batch, num_params)

    def train_step(self, model: nn.Module, optimizer: Any, inputs: Any, loss_fn: LossFn) -> torch.Tensor:
        """DeepSpeed's own loop: the engine clears gradients in ``step``, so after a step the
        model states a rank keeps (its gradient partitions) are still held, as for the others."""
        clock = PhaseClock(self.phase_clock)
        loss = loss_fn(model, inputs)
        clock.mark("forward")
        model.backward(loss)
        clock.mark("backward")
        model.step()
        clock.mark("optimizer")
        if self.engine.fp16_enabled():  # the engine skips an overflowing step itself
            self.count_step(skipped=not model.was_step_applied())
        return loss.detach()

    def loss_scale(self) -> float | None:
        """The fp16 section's dynamic loss scale; None at other precisions."""
        if self.engine is None or not self.engine.fp16_enabled():
            return None
        return float(self.engine.optimizer.loss_scale)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The module's whole parameters and buffers, copied (stage 3 gathers its partitions)."""
        from deepspeed.runtime.zero import GatheredParameters

        module = self.engine.module
        gathered = (
            GatheredParameters(list(module.parameters())) if self.stage == 3 else contextlib.nullcontext()
        )
        with gathered:
            return {k: v.detach().clone() for k, v in module.state_dict().items()}

    def memory_tensors(self) -> dict[str, list[torch.Tensor]]:
        """The engine's flat buffers, by what they are (see ``_typed``)."""
        if self.engine is None:
            return {}
        return _typed(self.engine.optimizer, self.engine.module)

    def observe_memory(self, observer: Callable[[torch.Tensor, str], None] | None) -> None:
        """Type the buffers DeepSpeed allocates during a step as it allocates them: stages 1-2
        make their two IPG reduce buckets at the start of each backward (``setup_buckets``;
        two because of ``overlap_comm``) and the gradient partition at the first reduction
        (``copy_grads_in_partition``), then free them in ``step``. Each of those methods is
        wrapped for the measured steps, and what the optimizer holds is typed after it runs."""
        optimizer = getattr(self.engine, "optimizer", None)
        for name, original in self._unwrapped.items():  # the previous observer's wrappers off
            setattr(optimizer, name, original)
        self._unwrapped = {}
        if observer is None or optimizer is None:
            return
        module = self.engine.module
        for name in _ALLOCATING_METHODS:
            original = getattr(optimizer, name, None)
            if original is None:
                continue

            def typed_after(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                out = _original(*args, **kwargs)
                for category, tensors in _typed(optimizer, module).items():
                    for t in tensors:
                        observer(t, category)
                return out

            self._unwrapped[name] = original
            setattr(optimizer, name, typed_after)

    def teardown(self) -> None:
        destroy = getattr(self.engine, "destroy", None)
        if destroy is not None:
            destroy()
        self.engine = None


def _tensors(value: Any) -> list[torch.Tensor]:
    if torch.is_tensor(value):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


#: DeepSpeed optimizer attributes -> what they hold (stages 1-2: DeepSpeedZeroOptimizer; stage
#: 3: DeepSpeedZeroOptimizer_Stage3). A name a version lacks is skipped.
_ATTRIBUTES = {
    "params": (
        "bit16_groups_flat",  # 1-2: every parameter, flat (the module's parameters view it)
        "fp16_partitioned_groups_flat",  # 3: this rank's parameter partitions
    ),
    "optimizer": (
        "single_partition_of_fp32_groups",  # 1-2: fp32 master partitions
        "fp32_partitioned_groups_flat",  # 3: fp32 master partitions
    ),
    "grads": (
        "averaged_gradients",  # 1-2: this rank's reduced gradient partitions
        "grads_in_partition",  # 2 with contiguous_gradients: the partition buffer
        "grad_partitions_flat_buffer",  # 3: gradient partitions
        "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition",
    ),
    "comm": (
        "ipg_buffer",  # 1-2 (older versions): the reduce bucket being filled in backward
        "_DeepSpeedZeroOptimizer_Stage3__ipg_bucket_flat_buffer",
    ),
}


#: DeepSpeed optimizer methods after which it holds a buffer it allocated during the step
_ALLOCATING_METHODS = (
    "setup_buckets",
    "copy_grads_in_partition",
    "reduce_ipg_grads",
    "independent_gradient_partition_epilogue",
    "step",  # stage 3 re-gathers its persistent parameters into fresh storage
)


def _typed(optimizer: Any, module: nn.Module | None = None) -> dict[str, list[torch.Tensor]]:
    out: dict[str, list[torch.Tensor]] = {}
    for category, names in _ATTRIBUTES.items():
        found = [t for n in names for t in _tensors(getattr(optimizer, n, None))]
        if category == "comm":
            found += [t for b in _tensors_of_buckets(optimizer) for t in b]
        if category == "params" and module is not None:
            # stage 3 keeps parameters below its persistence threshold whole on every rank,
            # re-gathered into fresh storage: parameters, not activations
            found += [p.data for p in module.parameters() if getattr(p, "ds_persist", False)]
        if found:
            out[category] = found
    inner = getattr(optimizer, "optimizer", None)  # the client AdamW over the fp32 partitions
    if isinstance(inner, torch.optim.Optimizer):
        state = [t for st in inner.state.values() for t in st.values() if torch.is_tensor(t)]
        out.setdefault("optimizer", []).extend(state)
    return out


def _tensors_of_buckets(optimizer: Any) -> list[list[torch.Tensor]]:
    """The flat buffers inside DeepSpeed's IPG bucket objects (``ipg_buckets``: stages 1-2 keep
    one per dtype, each holding its double buffer)."""
    buckets = getattr(optimizer, "ipg_buckets", None)
    if not isinstance(buckets, dict):
        return []
    return [_tensors(getattr(b, "buffer", None)) for b in buckets.values()]


class DeepSpeedZero1Strategy(DeepSpeedZeroStrategy, card="deepspeed-zero1"):
    stage = 1


class DeepSpeedZero2Strategy(DeepSpeedZeroStrategy, card="deepspeed-zero2"):
    stage = 2


class DeepSpeedZero3Strategy(DeepSpeedZeroStrategy, card="deepspeed-zero3"):
    stage = 3
