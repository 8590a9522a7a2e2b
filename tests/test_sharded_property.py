"""Our ZeRO stages 1, 2 and 3 against single-process AdamW on generated models: whatever the
shape, every stage trains to the reference's parameters.

Each case draws, from its seed, a model of random depth whose blocks sit in an ``nn.ModuleList``
or an ``nn.Sequential`` (stage 3's default units), with:

- per-sample gates on each block's sub-layers, drawn per step and chunk of the global batch, so
  a sub-layer that none of a rank's samples use is not called on that rank: parameters unused
  on some ranks and used on others, or on none, in any unit;
- a root parameter used by some chunks only, and one never used;
- a whole block skipped on some steps (on every rank: a unit is a collective to gather);
- frozen sub-layers, a weight tied across two blocks (units), the embedding tied to the head;
- one or two parameter groups, and global-norm clipping or none.

The reference trains the same model in one process on the whole global batch; a rank trains on
its share of the chunks. 12 chunks divide among N = 2, 3 and 4 ranks (3 pads every bucket).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from shardbench.strategies.sharded import ShardedDataParallel, ShardedOptimizer
from tests.dist import run_in_world
from tests.parity import max_rel_diff

SEEDS = range(6)
STAGES = (1, 2, 3)
CHUNKS, PER_CHUNK, SEQ, STEPS, LR = 12, 2, 3, 3, 1e-3


@dataclass(frozen=True)
class Shape:
    """A generated model's shape, drawn from its seed."""

    seed: int
    depth: int
    sequential: bool
    width: int
    vocab: int
    sublayers: int
    frozen: tuple[tuple[int, int], ...]  # (block, sub-layer)
    tie: tuple[int, int] | None  # blocks whose first sub-layer shares its weight
    groups: int
    clip: float | None

    @classmethod
    def draw(cls, seed: int) -> Shape:
        rng = random.Random(seed)
        depth = rng.randint(1, 4)
        sublayers = rng.randint(1, 3)
        frozen = tuple((b, s) for b in range(depth) for s in range(sublayers) if rng.random() < 0.2)
        tie = tuple(rng.sample(range(depth), 2)) if depth >= 2 and rng.random() < 0.7 else None
        return cls(
            seed=seed,
            depth=depth,
            sequential=rng.random() < 0.5,
            width=rng.choice((4, 6, 8)),
            vocab=rng.choice((11, 17)),
            sublayers=sublayers,
            frozen=frozen,
            tie=tie,  # type: ignore[arg-type]
            groups=rng.choice((1, 2)),
            clip=rng.choice((None, 0.05)),
        )


class Gates:
    """What this forward uses, shared by the model and its blocks (inside an ``nn.Sequential``
    a block sees only its input): per-sample gates of each block's sub-layers and the root's
    extra layer, and the blocks skipped at this step."""

    def __init__(self) -> None:
        self.sub: torch.Tensor | None = None  # (samples, depth, sublayers) of 0/1
        self.extra: torch.Tensor | None = None  # (samples,)
        self.skipped: set[int] = set()


class Block(nn.Module):
    def __init__(self, index: int, width: int, sublayers: int, gates: Gates) -> None:
        super().__init__()
        self.index = index
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(sublayers))
        self.gates = gates

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.gates.sub is not None
        out = x
        for s, layer in enumerate(self.layers):
            gate = self.gates.sub[:, self.index, s]
            if bool(gate.any()):  # no sample of this rank uses it: not called, no gradient
                out = out + gate[:, None] * torch.tanh(layer(x))
        return out


class Generated(nn.Module):
    def __init__(self, shape: Shape) -> None:
        super().__init__()
        torch.manual_seed(shape.seed)
        self.gates = Gates()
        self.embed = nn.Embedding(shape.vocab, shape.width)
        blocks = [Block(i, shape.width, shape.sublayers, self.gates) for i in range(shape.depth)]
        self.blocks = nn.Sequential(*blocks) if shape.sequential else nn.ModuleList(blocks)
        self.extra = nn.Linear(shape.width, shape.width)  # in the root unit, used by some chunks
        self.never = nn.Parameter(torch.randn(shape.width))  # in the root unit, never used
        self.head = nn.Linear(shape.width, shape.vocab, bias=False)
        self.head.weight = self.embed.weight
        for b, s in shape.frozen:
            blocks[b].layers[s].requires_grad_(False)
        if shape.tie is not None:
            i, j = shape.tie
            blocks[j].layers[0].weight = blocks[i].layers[0].weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens).mean(dim=1)
        if isinstance(self.blocks, nn.Sequential):
            x = self.blocks(x)
        else:
            for i, block in enumerate(self.blocks):
                if i not in self.gates.skipped:
                    x = block(x)
        assert self.gates.extra is not None
        if bool(self.gates.extra.any()):
            x = x + self.gates.extra[:, None] * self.extra(x)
        return self.head(x)


def global_batch(shape: Shape, step: int) -> dict[str, torch.Tensor]:
    """The step's global batch, each chunk with its own gates (drawn from seed, step, chunk)."""
    toks, labels, sub, extra = [], [], [], []
    for c in range(CHUNKS):
        g = torch.Generator().manual_seed(shape.seed * 10007 + step * 101 + c)
        toks.append(torch.randint(0, shape.vocab, (PER_CHUNK, SEQ), generator=g))
        labels.append(torch.randint(0, shape.vocab, (PER_CHUNK,), generator=g))
        # each sub-layer is used by about a third of the chunks: unused on some ranks, on all at times
        used = (torch.rand(shape.depth, shape.sublayers, generator=g) < 0.35).float()
        sub.append(used.expand(PER_CHUNK, -1, -1))
        extra.append(torch.full((PER_CHUNK,), float(torch.rand((), generator=g) < 0.3)))
    return {
        "tokens": torch.cat(toks),
        "labels": torch.cat(labels),
        "sub": torch.cat(sub),
        "extra": torch.cat(extra),
    }


def skipped_blocks(shape: Shape, step: int) -> set[int]:
    """Blocks of a ModuleList model skipped at ``step``, the same on every rank."""
    rng = random.Random(shape.seed * 31 + step)
    return {b for b in range(shape.depth) if rng.random() < 0.25}


def rank_share(batch: dict[str, torch.Tensor], rank: int, world_size: int) -> dict[str, torch.Tensor]:
    n = batch["labels"].shape[0] // world_size
    return {k: v[rank * n : (rank + 1) * n] for k, v in batch.items()}


def loss(model: nn.Module, gates: Gates, batch: dict[str, torch.Tensor], skipped: set[int]) -> torch.Tensor:
    gates.sub, gates.extra, gates.skipped = batch["sub"], batch["extra"], skipped
    return F.cross_entropy(model(batch["tokens"]), batch["labels"])


def param_groups(model: nn.Module, shape: Shape) -> list[dict]:
    trainable = [p for p in model.parameters() if p.requires_grad]
    if shape.groups == 1:
        return [{"params": trainable, "lr": LR, "weight_decay": 0.01}]
    return [
        {"params": [p for p in trainable if p.dim() >= 2], "lr": LR, "weight_decay": 0.01},
        {"params": [p for p in trainable if p.dim() < 2], "lr": 2 * LR, "weight_decay": 0.0},
    ]


def state_of(model: nn.Module) -> dict[str, torch.Tensor]:
    full = getattr(model, "full_state_dict", None)
    sd = full() if full is not None else model.state_dict()
    return {k: v.detach().clone() for k, v in sd.items()}


def reference(shape: Shape) -> dict[str, torch.Tensor]:
    model = Generated(shape)
    opt = torch.optim.AdamW(param_groups(model, shape))
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss(model, model.gates, global_batch(shape, step), skipped_blocks(shape, step)).backward()
        if shape.clip:
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], shape.clip)
        opt.step()
    return state_of(model)


def train(rank: int, world_size: int, seed: int, stage: int) -> dict[str, torch.Tensor]:
    shape = Shape.draw(seed)
    model = Generated(shape)
    opt = ShardedOptimizer(param_groups(model, shape), optim=torch.optim.AdamW, bucket_cap_mb=0.0002)
    if stage == 1 and seed % 2:  # stage 1 both ways: under plain DDP, and under our wrapper
        wrapped: nn.Module = DistributedDataParallel(model, find_unused_parameters=True)
    else:
        wrapped = ShardedDataParallel(model, opt, stage=stage)
    try:
        for step in range(STEPS):
            opt.zero_grad(set_to_none=True)
            batch = rank_share(global_batch(shape, step), rank, world_size)
            loss(wrapped, model.gates, batch, skipped_blocks(shape, step)).backward()
            if shape.clip:
                opt.clip_grad_norm_(shape.clip)
            opt.step()
        return state_of(wrapped if stage == 3 else model)
    finally:
        if isinstance(wrapped, ShardedDataParallel):
            wrapped.close()


def train_every_case(rank: int, world_size: int) -> dict[tuple[int, int], dict[str, torch.Tensor]]:
    """Every seed at every stage, in one world: a world's start-up costs more than the cases."""
    torch.set_num_threads(1)
    return {(seed, stage): train(rank, world_size, seed, stage) for seed in SEEDS for stage in STAGES}


def test_the_generated_shapes_cover_every_feature() -> None:
    """The seeds draw every feature the module docstring lists at least once."""
    shapes = [Shape.draw(s) for s in SEEDS]
    assert {s.sequential for s in shapes} == {True, False}
    assert {s.groups for s in shapes} == {1, 2}
    assert {s.clip is None for s in shapes} == {True, False}
    assert any(s.frozen for s in shapes) and any(s.tie for s in shapes)
    assert len({s.depth for s in shapes}) >= 3
    assert any(skipped_blocks(s, t) for s in shapes if not s.sequential for t in range(STEPS))
    # a sub-layer unused by every chunk of a step, and one used by some chunks only
    gates = [global_batch(s, t)["sub"].amax(dim=0) for s in shapes for t in range(STEPS)]
    assert any(bool((g == 0).any()) for g in gates)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_every_stage_matches_single_process_adamw(world_size: int) -> None:
    results = run_in_world(train_every_case, world_size, timeout_s=300.0)
    for seed in SEEDS:
        ref = reference(Shape.draw(seed))
        for stage in STAGES:
            for rank, states in enumerate(results):
                diff, where = max_rel_diff(states[(seed, stage)], ref)
                assert diff < 1e-6, (
                    f"seed {seed} stage {stage} N={world_size} rank {rank}: {where} off by {diff:.2e}"
                )
