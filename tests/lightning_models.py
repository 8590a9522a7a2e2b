"""LightningModules for the Lightning tests (``test_lightning_*.py``), and running a Trainer
inside ranks that ``tests/dist.py`` already started.

A Trainer with ``devices=2`` launches its own processes unless the environment says they exist:
``LOCAL_RANK`` set (Lightning's ``LightningEnvironment``), so inside a rank it joins the process
group that is already there instead."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class TinyLit(pl.LightningModule):
    """Tied embedding and head, a frozen layer, a branch used on every third batch only, and
    an LR schedule: what a sharded strategy gets wrong first."""

    def __init__(
        self,
        vocab: int = 32,
        width: int = 16,
        depth: int = 2,
        samples: int = 48,
        seq: int = 6,
        sgd: bool = False,
    ) -> None:
        super().__init__()
        self.vocab, self.samples, self.seq, self.sgd = vocab, samples, seq, sgd
        self.embed = nn.Embedding(vocab, width)
        self.frozen = nn.Linear(width, width)
        self.frozen.requires_grad_(False)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(depth))
        self.branch = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.losses: list[float] = []

    def forward(self, tokens: torch.Tensor, use_branch: bool = False) -> torch.Tensor:
        h = self.frozen(self.embed(tokens))
        for block in self.blocks:
            h = h + block(h)
        if use_branch:
            h = h + self.branch(h)
        return self.head(h)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        tokens, targets = batch
        logits = self(tokens, use_branch=batch_idx % 3 == 1)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        self.losses.append(float(loss.detach()))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        tokens, targets = batch
        return F.cross_entropy(self(tokens).flatten(0, 1).float(), targets.flatten())

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0]).argmax(-1)

    def configure_optimizers(self) -> Any:
        # (the frozen layer's parameters included.) SGD: a step proportional to the gradient, so
        # a clip or a learning rate that did not apply shows; AdamW: state to checkpoint
        params = self.parameters()
        opt = (
            torch.optim.SGD(params, lr=0.5, momentum=0.9) if self.sgd else torch.optim.AdamW(params, lr=1e-2)
        )
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def _data(self) -> TensorDataset:
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, self.vocab, (self.samples, self.seq), generator=g)
        return TensorDataset(tokens, torch.roll(tokens, 1, dims=1))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self._data(), batch_size=4)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self._data(), batch_size=8)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self._data(), batch_size=8)


class NoBlocksLit(TinyLit):
    """No nn.ModuleList/nn.Sequential: stage 3 finds no units."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList()


class LionLike(torch.optim.SGD):
    """Not in ELEMENTWISE_OPTIMIZERS (a subclass of none of them would be refused the same)."""


class UnshardableLit(TinyLit):
    def configure_optimizers(self) -> Any:
        return torch.optim.Adafactor(self.parameters(), lr=1e-2)


@contextlib.contextmanager
def in_rank(rank: int, world_size: int) -> Iterator[None]:
    """The environment that tells Lightning this process is rank ``rank`` of a world already
    launched (its process group initialised), for as long as the block runs."""
    env = {"LOCAL_RANK": str(rank), "NODE_RANK": "0", "RANK": str(rank), "WORLD_SIZE": str(world_size)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def trainer(strategy: Any, world_size: int = 2, **kwargs: Any) -> pl.Trainer:
    """A quiet CPU Trainer of ``world_size`` devices (inside ``in_rank``)."""
    options: dict[str, Any] = {
        "max_steps": 5,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
        "limit_val_batches": 0,
        **kwargs,
    }
    return pl.Trainer(accelerator="cpu", devices=world_size, strategy=strategy, **options)


class ExampleOnlyLit(pl.LightningModule):
    """No train_dataloader: its batches are shaped as example_input_array."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
        self.example_input_array = torch.zeros(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class NoDataLit(ExampleOnlyLit):
    def __init__(self) -> None:
        super().__init__()
        self.example_input_array = None


class TwoOptimizersLit(ExampleOnlyLit):
    def configure_optimizers(self) -> Any:
        return [torch.optim.SGD(self.net[0].parameters(), lr=0.1), torch.optim.SGD(self.net[2].parameters())]


class FinetuneLit(pl.LightningModule):
    """A ``backbone`` (what ``BackboneFinetuning`` freezes, then unfreezes and adds as a param
    group; its layers are stage 3's units) and a head, the one part in the optimizer at first.
    Train it with ``use_distributed_sampler=False``, every rank reading every sample: ``ddp``
    never averages a parameter unfrozen after it wrapped the model (its ranks drift apart), so
    only on the same data does it train what a single process would, and the strategies can be
    compared on every parameter."""

    def __init__(self, width: int = 8, samples: int = 8) -> None:
        super().__init__()
        self.samples = samples
        layers = [nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh()]
        self.backbone = nn.Sequential(*layers)
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
        return {"optimizer": opt, "lr_scheduler": sched}

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.samples, self.backbone[0].in_features, generator=g)
        y = torch.randn(self.samples, 2, generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=2)
