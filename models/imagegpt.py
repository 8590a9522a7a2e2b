"""Image GPT: ``ImageGPTForCausalImageModeling`` from an ``ImageGPTConfig`` (never downloaded).

Images are 32x32 grids of colour-cluster tokens (512 clusters; token 512 is the start token), so
a sequence is the start token followed by the first 1023 pixels in raster order, and the loss is
next-token cross-entropy over the pixels (transformers shifts the labels). Presets follow the
Image GPT paper: iGPT-S (n_embd 512, 24 layers, 8 heads, 76M parameters), iGPT-M (1024, 36, 8,
455M), iGPT-L (1536, 48, 16, 1.36B). Optimizer: AdamW (the paper uses Adam with weight decay;
the lr is ours, the benchmark measures memory and time, not convergence).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from shardbench.models.base import BuiltinWorkload, Inputs, batch_generator
from shardbench.models.presets import imagegpt as presets_module
from shardbench.models.presets.imagegpt import CLUSTERS

if TYPE_CHECKING:  # transformers takes seconds to import: only building a model needs it
    from transformers import ImageGPTConfig


class ImageGPTWorkload(BuiltinWorkload):
    name = "imagegpt"
    lr = 1e-4
    shapes = presets_module
    presets = presets_module.PRESETS
    ladder = presets_module.LADDER

    def _config(self, preset: str, dropout: bool) -> tuple[ImageGPTConfig, int]:
        from transformers import ImageGPTConfig

        self.check_preset(preset)
        p = dict(self.presets[preset])
        side = p.pop("side")
        drop = 0.1 if dropout else 0.0
        config = ImageGPTConfig(
            vocab_size=CLUSTERS + 1,
            n_positions=side * side,
            resid_pdrop=drop,
            embd_pdrop=drop,
            attn_pdrop=drop,
            **p,
        )
        return config, side

    def build(self, preset: str, *, dropout: bool = True) -> nn.Module:
        from transformers import ImageGPTForCausalImageModeling

        config, _ = self._config(preset, dropout)
        return ImageGPTForCausalImageModeling(config)

    def tokens_per_sample(self, preset: str) -> int:
        """The sequence: the start token and the first ``side * side - 1`` pixels."""
        self.check_preset(preset)
        return int(self.presets[preset]["side"]) ** 2

    def checkpoint_units(self, model: nn.Module) -> list[nn.Module]:
        """Each transformer block (``transformer.h[i]``: attention and MLP)."""
        blocks = model.transformer.h
        assert isinstance(blocks, nn.ModuleList)
        return list(blocks)

    def batch(
        self,
        preset: str,
        batch_size: int,
        *,
        seed: int,
        step: int,
        rank: int,
        device: torch.device | str = "cpu",
    ) -> Inputs:
        self.check_preset(preset)
        side = self.presets[preset]["side"]  # the preset alone: making data needs no transformers
        g = batch_generator(seed=seed, step=step, rank=rank)
        pixels = torch.randint(0, CLUSTERS, (batch_size, side * side - 1), generator=g)
        start = torch.full((batch_size, 1), CLUSTERS)
        return {"input_ids": torch.cat([start, pixels], dim=1).to(device)}

    def loss(self, model: nn.Module, inputs: Inputs) -> torch.Tensor:
        ids = inputs["input_ids"]
        # No KV cache: training never reads one, and under activation checkpointing a block's
        # recompute would append its keys and values to it a second time. (Memory is the same
        # either way: the cache held the very tensors attention saves for backward.)
        return model(input_ids=ids, labels=ids, use_cache=False).loss
