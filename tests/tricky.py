"""A model built to trip up a sharded optimizer: tied weights, a frozen layer, a branch that is
unused in some steps, two parameter groups, and a parameter larger than the others combined
(the embedding, tied to the output head)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shardbench.models.base import batch_generator

VOCAB, DIM, SEQ = 97, 16, 5


class TrickyNet(nn.Module):
    def __init__(self, vocab: int = VOCAB) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, DIM)
        self.frozen = nn.Linear(DIM, DIM)
        self.frozen.requires_grad_(False)
        self.body = nn.Linear(DIM, DIM)
        self.branch = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, vocab)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens: torch.Tensor, use_branch: bool) -> torch.Tensor:
        x = self.embed(tokens).mean(dim=1)
        x = torch.tanh(self.body(self.frozen(x)))
        if use_branch:
            x = x + torch.tanh(self.branch(x))
        return self.head(x)


def build(vocab: int = VOCAB) -> TrickyNet:
    torch.manual_seed(0)
    return TrickyNet(vocab)


def child_units(model: nn.Module):
    """A stage-3 unit policy making every child a unit: the tied embedding and head fall in two
    units (so their weight is gathered by the root, which encloses both), the frozen layer a
    unit of frozen parameters only (gathered for its forward, and for its backward, which
    needs its weight for its input's gradient), and the branch a unit unused on odd steps."""
    children = {id(m) for m in model.children()}
    return lambda module: id(module) in children


def param_groups(model: nn.Module, lr: float = 1e-4) -> list[dict]:
    """Two groups: matrices with weight decay, vectors with twice the lr and none."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in trainable if p.dim() >= 2], "lr": lr, "weight_decay": 0.01},
        {"params": [p for p in trainable if p.dim() < 2], "lr": 2 * lr, "weight_decay": 0.0},
    ]


def global_batch(step: int, chunks: int, chunk_size: int = 4, vocab: int = VOCAB) -> dict:
    """The step's global batch: ``chunks`` deterministic chunks concatenated."""
    toks, labels = [], []
    for c in range(chunks):
        g = batch_generator(seed=1, step=step, rank=c)
        toks.append(torch.randint(0, vocab, (chunk_size, SEQ), generator=g))
        labels.append(torch.randint(0, vocab, (chunk_size,), generator=g))
    return {"tokens": torch.cat(toks), "labels": torch.cat(labels)}


def rank_slice(batch: dict, rank: int, world_size: int) -> dict:
    n = batch["labels"].shape[0] // world_size
    return {k: v[rank * n : (rank + 1) * n] for k, v in batch.items()}


def loss(model: nn.Module, batch: dict, step: int) -> torch.Tensor:
    """The branch is used on even steps only (on every rank, so it is globally unused on odd)."""
    return F.cross_entropy(model(batch["tokens"], step % 2 == 0).float(), batch["labels"])


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Whole parameters and buffers, in fp32 (a stage-3 wrapper consolidates its shards)."""
    full_state_dict = getattr(model, "full_state_dict", None)
    sd = full_state_dict() if full_state_dict is not None else model.state_dict()
    return {k: v.detach().float().clone() for k, v in sd.items()}


def train_sharded_steps(
    wrapped: nn.Module, opt: torch.optim.Optimizer, steps: range, rank: int, world_size: int, chunks: int = 4
) -> None:
    """The training loop the sharded tests share: this rank's slice of each global batch."""
    for step in steps:
        opt.zero_grad(set_to_none=True)
        loss(wrapped, rank_slice(global_batch(step, chunks), rank, world_size), step).backward()
        opt.step()
