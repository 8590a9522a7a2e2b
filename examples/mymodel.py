"""A model of your own, as shardbench takes it (docs/own-models.md).

``factory`` returns a ``ModelSpec``: how to build the module (called once per rank, after the
seed is set, under the device and FakeTensorMode contexts the harness needs) and what a sample
looks like. Here a small decoder over token ids: the blocks sit in an ``nn.ModuleList``, which
is what zero3 and FSDP2 gather as units and ``--activation-checkpointing`` recomputes. The loss is
cross-entropy against the integer ``labels`` input, read off the logits the model returns.

The factory's keyword arguments are its shapes (``--model-config width=512,depth=8``), and
``depth="depth"`` tells ``max-size --vary params`` and the claim which one adds blocks:

    .venv/bin/shardbench max-size --workload examples/mymodel.py:factory --strategy ddp,zero3 \
        --world-size 8 --fake --budget 1GiB

    .venv/bin/shardbench plan --workload examples/mymodel.py:factory --world-size 8 --budget 2GiB
    .venv/bin/shardbench run --workload examples/mymodel.py:factory --strategy ddp,zero2 --world-size 2
"""

from __future__ import annotations

import torch
from torch import nn

from shardbench import Input, ModelSpec

VOCAB, WIDTH, DEPTH, SEQ = 8192, 256, 4, 64


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, num_heads=8, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyDecoder(nn.Module):
    def __init__(self, width: int = WIDTH, depth: int = DEPTH) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, VOCAB)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def factory(width: int = WIDTH, depth: int = DEPTH) -> ModelSpec:
    return ModelSpec(
        build=lambda: TinyDecoder(width, depth),
        inputs={"tokens": Input((SEQ,), high=VOCAB), "labels": Input((SEQ,), high=VOCAB)},
        depth="depth",
    )
