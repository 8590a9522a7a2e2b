"""The FSDP2 peers (``fully_shard``): ``fsdp2-zero2`` and ``fsdp2-zero3`` differ only in whether
parameters are resharded after forward.

* ``fsdp2-zero2``, ``reshard_after_forward=False``: parameters stay unsharded from forward to
  backward, so, like ZeRO-2, steady-state sharding is optimizer state and gradients.
* ``fsdp2-zero3``, ``reshard_after_forward=True``: parameters are sharded too and gathered per
  block when needed (ZeRO-3).

Configured as the FSDP2 documentation and torchtitan do: ``fully_shard`` on every repeated
block (each parameterised child of an ``nn.ModuleList`` or ``nn.Sequential``: transformer
layers, ResNet stages' blocks...),
or on the units the workload names (``Workload.shard_units``, the same ones zero3 gathers; the
transformer adds its embeddings, as torchtitan wraps ``tok_embeddings``), then on the root;
bf16 via ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` over fp32 sharded
parameters.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from shardbench.blocks import repeated_blocks
from shardbench.metrics.analytic import ZERO3, Communication, Sharding
from shardbench.precision import compute_dtype, element_bytes, is_half
from shardbench.strategies.base import OptimizerFactory, RankContext, Strategy


def _fsdp_api() -> tuple[Any, Any, Any]:
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError as e:
        raise RuntimeError(
            f"FSDP2 (torch.distributed.fsdp.fully_shard) is not available in torch "
            f"{torch.__version__}; it needs torch >= 2.6"
        ) from e
    return init_device_mesh, MixedPrecisionPolicy, fully_shard


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules to wrap before the root where the workload names none: the repeated blocks
    (each parameterised child of an ``nn.ModuleList`` or ``nn.Sequential``, outermost), the same
    default zero3 gathers, so the two compare like for like on any model (a ResNet's blocks sit
    in ``nn.Sequential`` stages: wrapping ``nn.ModuleList`` children only left them in the root)."""
    return repeated_blocks(model)


class FSDP2Strategy(Strategy):
    """Shared set-up; a subclass only chooses ``reshard_after_forward`` (and declares its sharding)."""

    reshard_after_forward: ClassVar[bool]

    def __init__(self) -> None:
        self.mesh: Any = None
        self.wrap = "each repeated block (nn.ModuleList/nn.Sequential child), then the root"

    def init_world(self, ctx: RankContext) -> None:
        init_device_mesh = _fsdp_api()[0]
        self.mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))

    def settings(self) -> dict[str, Any]:
        return {
            "reshard_after_forward": self.reshard_after_forward,
            "wrap": self.wrap,
            "mixed_precision": "param 16-bit, reduce fp32 (bf16 and fp16 runs)",
            "loss_scaler": "torch.amp.GradScaler, found_inf reduced over the mesh by DTensor (fp16 runs)",
        }

    def communication(self, precision: str, backend: str) -> Communication:
        """Per unit: an all-gather of its parameters, frozen ones included (bf16 under the bf16
        policy), before forward, again before backward when resharded after forward, and a
        reduce-scatter of its fp32 gradients; each parameter sharded on dim 0, padded to a
        multiple of N."""
        return Communication(
            gradients="reduce_scatter",
            gradient_bytes=4,
            parameters="all_gather",
            parameter_bytes=element_bytes(precision),
            gathers=2 if self.reshard_after_forward else 1,
            dim0_padding=True,
            frozen_gathered=True,
            gathers_into_fresh_memory=True,
            copies_through_buffers=True,
        )

    def prepare_precision(self, model: nn.Module, precision: str) -> tuple[nn.Module, torch.dtype | None]:
        return model, None  # fp32 sharded parameters; 16-bit comes from the MixedPrecisionPolicy

    def setup(
        self, model: nn.Module, optimizer_factory: OptimizerFactory, ctx: RankContext
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        _, MixedPrecisionPolicy, fully_shard = _fsdp_api()
        if self.mesh is None:
            self.init_world(ctx)
        mesh = self.mesh
        mp = (
            MixedPrecisionPolicy(param_dtype=compute_dtype(ctx.precision), reduce_dtype=torch.float32)
            if is_half(ctx.precision)
            else MixedPrecisionPolicy()
        )
        units = ctx.shard_units if ctx.shard_units is not None else shard_units(model)
        if ctx.shard_units is not None:
            self.wrap = "the workload's units (Workload.shard_units), then the root"
        fp32_norms: set[int] = set()
        if is_half(ctx.precision):
            # Batch norm keeps fp32 parameters, as FSDP keeps it out of mixed precision: its
            # running statistics are fp32, and batch_norm wants its weight in their dtype. Each
            # is a unit of its own that takes its input in fp32 and gives its output back in
            # the compute dtype, so the layers around it see 16-bit tensors.
            norm = MixedPrecisionPolicy(
                param_dtype=torch.float32,
                reduce_dtype=torch.float32,
                output_dtype=compute_dtype(ctx.precision),
            )
            for module in model.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm) and any(
                    True for _ in module.parameters()
                ):
                    fully_shard(
                        module, mesh=mesh, reshard_after_forward=self.reshard_after_forward, mp_policy=norm
                    )
                    fp32_norms.add(id(module))
        for unit in (u for u in units if id(u) not in fp32_norms):
            fully_shard(unit, mesh=mesh, reshard_after_forward=self.reshard_after_forward, mp_policy=mp)
        fully_shard(model, mesh=mesh, reshard_after_forward=self.reshard_after_forward, mp_policy=mp)
        return model, optimizer_factory(model)


class FSDP2Zero2Strategy(FSDP2Strategy, card="fsdp2-zero2"):
    reshard_after_forward = False

    def kept_sharding(self) -> Sharding:
        """ZeRO-3's: its parameters stay whole from forward into backward only; FSDP2 reshards
        every unit after backward, so between steps a rank keeps 1/N of them, as fsdp2-zero3."""
        return ZERO3


class FSDP2Zero3Strategy(FSDP2Strategy, card="fsdp2-zero3"):
    reshard_after_forward = True
