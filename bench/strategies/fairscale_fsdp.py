"""``fairscale-zero3``: FairScale's ``FullyShardedDataParallel`` (ZeRO-3), wrapped per repeated
block then at the root, as FairScale's documentation and FSDP2's peer here do.

It runs only on CUDA: FairScale's FSDP initialises CUDA when it wraps a model (the card says
so, and a CPU cell is refused before it runs). Parameters are not flattened
(``flatten_parameters=False``): FairScale refuses to flatten a frozen parameter with trainable
ones in one unit, which real models (a frozen embedding, adapters) have.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from shardbench.blocks import repeated_blocks
from shardbench.precision import compute_dtype, is_half
from shardbench.strategies.base import OptimizerFactory, RankContext, Strategy
from shardbench.strategies.fairscale_oss import fairscale_scaler


class FairScaleZero3Strategy(Strategy, card="fairscale-zero3"):
    def settings(self) -> dict[str, Any]:
        import fairscale

        return {
            "fairscale": fairscale.__version__,
            "reshard_after_forward": True,
            "flatten_parameters": False,
            "mixed_precision": "16-bit compute over fp32 parameters (bf16 and fp16 runs)",
            "loss_scaler": "fairscale ShardedGradScaler (fp16 runs)",
            "wrap": "each repeated block (or the workload's units), then the root",
        }

    def prepare_precision(self, model: nn.Module, precision: str) -> tuple[nn.Module, torch.dtype | None]:
        return model, None  # FSDP's own mixed precision (compute_dtype), not autocast

    def loss_scaler(self, optimizer: Any, ctx: RankContext) -> Any:
        """FairScale's ``ShardedGradScaler``, which its FSDP documents for fp16: it agrees on
        an overflow over the process group, each rank seeing only its shards' gradients."""
        return fairscale_scaler(ctx)

    def setup(
        self, model: nn.Module, optimizer_factory: OptimizerFactory, ctx: RankContext
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        from fairscale.nn.data_parallel import FullyShardedDataParallel as FSDP

        options = {
            "process_group": ctx.process_group,
            "reshard_after_forward": True,
            "flatten_parameters": False,
            "mixed_precision": is_half(ctx.precision),
            "compute_dtype": compute_dtype(ctx.precision),
        }
        units = ctx.shard_units if ctx.shard_units is not None else repeated_blocks(model)
        for unit in units:
            _replace_child(model, unit, FSDP(unit, **options))
        wrapped = FSDP(model, **options)
        return wrapped, optimizer_factory(wrapped)


def _replace_child(root: nn.Module, child: nn.Module, wrapper: nn.Module) -> None:
    """Put ``wrapper`` where ``child`` sits in ``root`` (FairScale wraps by replacement)."""
    for module in root.modules():
        for name, sub in module.named_children():
            if sub is child:
                setattr(module, name, wrapper)
                return
