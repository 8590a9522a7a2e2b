"""Small workloads for parity tests, built to avoid degenerate parameters.

Why not only the tiny transformer: some of its parameters get gradients that are pure rounding
noise (an attention key bias shifts every score of a query equally, so softmax ignores it);
Adam normalises that noise into lr-sized steps of random sign, so no elementwise tolerance is
meaningful for them against a differently-summed reference. ``MLPWorkload`` has only parameters
with real gradients, so AdamW parity can be held to 1e-6.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from shardbench.models.base import Inputs, Workload, batch_generator


class MLP(nn.Module):
    def __init__(self, vocab: int, dim: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens).mean(dim=1)
        x = x + self.fc2(torch.tanh(self.fc1(x)))
        return self.head(x)


class MLPWorkload(Workload):
    name = "test-mlp"
    # small enough that Adam's sign-of-noise steps on near-zero gradients stay below 1e-6 of the
    # weights, large enough that a wrong update (one step off, a lost shard) is ~1e-3 away
    lr = 1e-4
    presets: dict[str, dict[str, Any]] = {
        "tiny": dict(vocab=512, dim=32, classes=8, seq=6),
        # every parameter above DeepSpeed's stage-3 persistence threshold (1e5 elements), so
        # its ZeRO-3 partitions and gathers each of them rather than keeping it whole
        "wide": dict(vocab=512, dim=160, classes=8, seq=6),
    }

    def build(self, preset: str, *, dropout: bool = True) -> nn.Module:
        p = self.presets[preset]
        return MLP(p["vocab"], p["dim"], p["classes"])

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
        p = self.presets[preset]
        g = batch_generator(seed=seed, step=step, rank=rank)
        return {
            "tokens": torch.randint(0, p["vocab"], (batch_size, p["seq"]), generator=g).to(device),
            "labels": torch.randint(0, p["classes"], (batch_size,), generator=g).to(device),
        }

    def loss(self, model: nn.Module, inputs: Inputs) -> torch.Tensor:
        return F.cross_entropy(model(inputs["tokens"]), inputs["labels"])
