"""Stage 3's frozen parameters (bench/strategies/sharded/frozen.py): sharded between uses,
gathered whole with their unit in forward and in backward (an activation-checkpointed unit's
recompute, and the gradient of a frozen unit's input, need their values), their chunk released
while they are whole, never given a gradient or optimizer state, and whole again in
``full_state_dict``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shardbench.models.checkpointing import apply_activation_checkpointing
from shardbench.strategies.sharded import ShardedDataParallel, ShardedOptimizer
from shardbench.strategies.sharded.units import find_units
from tests.dist import run_in_world
from tests.parity import max_rel_diff

DIM, STEPS, BATCH = 6, 3, 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(DIM, DIM)
        self.b = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.b(torch.tanh(self.a(x))))


class FrozenNet(nn.Module):
    """A trainable input layer, then a frozen stem (the root's), a wholly frozen block (a unit
    of frozen parameters only, whose backward still computes its input's gradient), a block
    with a frozen sub-layer, and a trainable head; a frozen weight tied across the two blocks
    (units), so it belongs to the root, which encloses both."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.inp = nn.Linear(DIM, DIM)
        self.stem = nn.Linear(DIM, DIM)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(DIM, 3)
        self.blocks[1].a.weight = self.blocks[0].a.weight
        self.stem.requires_grad_(False)
        self.blocks[0].requires_grad_(False)
        self.blocks[1].a.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(torch.tanh(self.inp(x)))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _units(model: FrozenNet):
    blocks = {id(b) for b in model.blocks}
    return lambda module: id(module) in blocks


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(BATCH, DIM, generator=g), torch.randint(0, 3, (BATCH,), generator=g)


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def _trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _reference() -> dict[str, torch.Tensor]:
    model = FrozenNet(seed=0)
    opt = torch.optim.AdamW(_trainable(model), lr=1e-2)
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        _loss(model, *_batch(step)).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_frozen_parameter_belongs_to_its_lowest_common_unit() -> None:
    model = FrozenNet(seed=0)
    frozen = [p for p in model.parameters() if not p.requires_grad]
    units = {u.name: u for u in find_units(model, _units(model), _trainable(model), frozen)}
    assert list(units) == ["", "blocks.0", "blocks.1"]  # a wholly frozen block is a unit too
    tied = model.blocks[0].a.weight
    assert {id(p) for p in units[""].frozen} == {id(model.stem.weight), id(model.stem.bias), id(tied)}
    assert units["blocks.0"].params == [] and {id(p) for p in units["blocks.0"].frozen} == {
        id(model.blocks[0].a.bias),
        *map(id, model.blocks[0].b.parameters()),
    }
    assert units["blocks.1"].frozen == [model.blocks[1].a.bias]
    assert sum(len(u.frozen) for u in units.values()) == len(frozen)


def _train(rank: int, world_size: int, checkpointed: bool, prefetch: bool) -> dict:
    model = FrozenNet(seed=rank)  # ranks differ: rank 0's values are the ones trained
    if checkpointed:
        apply_activation_checkpointing(model, list(model.blocks))
    frozen = {id(p): name for name, p in model.named_parameters() if not p.requires_grad}
    opt = ShardedOptimizer(_trainable(model), optim=torch.optim.AdamW, lr=1e-2)
    sdp = ShardedDataParallel(model, opt, stage=3, unit=_units(model), prefetch=prefetch)
    seen: list[dict[str, torch.Tensor]] = []  # the frozen block's weights as its forward sees them
    model.blocks[0].register_forward_pre_hook(
        lambda m, _: seen.append({k: v.detach().clone() for k, v in m.state_dict().items()})
    )
    store = sdp.gatherer.frozen
    sharded_between_steps, grads, root_chunks_in_step = [], [], []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        x, y = _batch(step)
        n = BATCH // world_size
        loss = _loss(sdp, x[rank * n : (rank + 1) * n], y[rank * n : (rank + 1) * n])
        root_chunks = [store.chunks[i] for i in store.unit_buckets[0]]
        root_chunks_in_step.append(sum(c.untyped_storage().nbytes() for c in root_chunks))
        loss.backward()
        grads += [p.grad for p in model.parameters() if id(p) in frozen]
        opt.step()
        sharded_between_steps.append(
            all(p.untyped_storage().size() == 0 for p in model.parameters() if id(p) in frozen)
            and all(c.untyped_storage().nbytes() == 4 * c.numel() for c in store.chunks)
        )
    frozen_chunks = sum(c.numel() for c in sdp.gatherer.frozen.chunks)
    owned = sum(pc.numel for b in opt.buckets for pc in b.pieces)
    state = sum(v.numel() for st in opt.state.values() for v in st.values() if v.dim() > 0)
    full = {k: v.clone() for k, v in sdp.full_state_dict().items()}
    sdp.close()
    return {
        "state": full,
        "seen": seen,
        "sharded": sharded_between_steps,
        "root_chunks_in_step": root_chunks_in_step,
        "grads": grads,
        "frozen_chunks": frozen_chunks,
        "state_elements": (state, owned),
        "frozen_names": sorted(frozen.values()),
    }


@pytest.mark.parametrize(("checkpointed", "prefetch"), [(False, True), (True, True), (True, False)])
def test_frozen_parameters_are_sharded_and_whole_where_used(checkpointed: bool, prefetch: bool) -> None:
    """Two ranks that initialised differently train to the single-process reference built from
    rank 0's values: the frozen weights a unit's forward, its recompute and its input's gradient
    use are rank 0's, whole; between steps a rank holds only its chunk of them."""
    ref, initial = _reference(), FrozenNet(seed=0).state_dict()
    frozen_elements = sum(p.numel() for p in FrozenNet(seed=0).parameters() if not p.requires_grad)
    for rank, r in enumerate(run_in_world(_train, 2, checkpointed, prefetch)):
        diff, where = max_rel_diff(r["state"], ref)
        assert diff < 1e-6, f"rank {rank}: {where} off by {diff:.2e}"
        for name in r["frozen_names"]:  # whole, and unchanged by training
            assert torch.equal(r["state"][name], initial[name]), name
        assert len(r["seen"]) == STEPS
        for seen in r["seen"]:
            assert all(torch.equal(v, initial[f"blocks.0.{k}"]) for k, v in seen.items())
        assert all(r["sharded"]) and all(g is None for g in r["grads"])
        # the root stays whole from forward into backward, and meanwhile its frozen chunk is
        # released (a copy of part of what is whole), and cut again when the root is freed
        assert r["root_chunks_in_step"] == [0] * STEPS
        # this rank's chunk of each frozen buffer: half of them, plus at most one padding element
        # per buffer (three: the root's, and one per block)
        assert frozen_elements / 2 <= r["frozen_chunks"] <= frozen_elements / 2 + 3
        state, owned = r["state_elements"]
        assert state == 2 * owned  # AdamW's two moments, of the trainable elements only
