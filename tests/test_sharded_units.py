"""Stage 3's units (bench/strategies/sharded/units.py): which parameters each unit gathers, and
the errors a user gets for what stage 3 cannot do."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from shardbench.models.registry import get_workload
from shardbench.strategies.sharded import ShardedDataParallel, ShardedOptimizer
from shardbench.strategies.sharded.units import find_units
from tests import tricky
from tests.dist import run_simulated_here


class Tied(nn.Module):
    """Blocks in a ModuleList; the first block's embedding is tied to the last block's head."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            [
                nn.Embedding(10, 4),
                nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)),
                nn.Linear(4, 10),
            ]
        )
        self.blocks[2].weight = self.blocks[0].weight
        self.norm = nn.LayerNorm(4)
        self.frozen = nn.ModuleList([nn.Linear(4, 4)])
        self.frozen.requires_grad_(False)


def _trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def test_default_policy_gathers_each_block_and_ties_into_the_root() -> None:
    model = Tied()
    units = find_units(model, None, _trainable(model))
    names = {u.name: u for u in units}
    # the embedding's unit lost its only (tied) weight to the root; the frozen block is no unit;
    # the Sequential inside blocks.1 is not split further (outermost blocks only)
    assert list(names) == ["", "blocks.1", "blocks.2"]
    root = names[""]
    assert root.is_root and root.params[0] is model.blocks[0].weight
    assert {id(p) for p in root.params} == {id(model.blocks[0].weight), *map(id, model.norm.parameters())}
    assert names["blocks.1"].parent == root.index and len(names["blocks.1"].params) == 4
    assert names["blocks.2"].params == [model.blocks[2].bias]
    assert sum(len(u.params) for u in units) == len(_trainable(model))


def test_default_policy_on_the_transformer_is_one_unit_per_layer() -> None:
    model = get_workload("transformer").build("tiny")
    units = find_units(model, None, _trainable(model))
    layers = [f"bert.encoder.layer.{i}" for i in range(len(model.bert.encoder.layer))]
    assert [u.name for u in units] == ["", *layers]
    assert [u.module for u in units[1:]] == list(model.bert.encoder.layer)


def test_a_custom_policy_may_nest_units() -> None:
    model = Tied()
    inner = model.blocks[1][0]
    units = find_units(model, lambda m: m is model.blocks[1] or m is inner, _trainable(model))
    by_name = {u.name: u for u in units}
    assert by_name["blocks.1.0"].parent == by_name["blocks.1"].index
    assert by_name["blocks.1.0"].params == [inner.weight, inner.bias]


def _errors(rank: int, world_size: int) -> None:
    model = tricky.build()
    opt = ShardedOptimizer(tricky.param_groups(model), optim=torch.optim.AdamW)
    with pytest.raises(ValueError, match="stage must be 1, 2 or 3, got 4"):
        ShardedDataParallel(model, opt, stage=4)
    with pytest.raises(ValueError, match="prefetch, unit: stage 3 options"):
        ShardedDataParallel(model, opt, unit=None, prefetch=False)
    sdp = ShardedDataParallel(model, opt, stage=3)
    assert sdp.stage == 3 and [u.name for u in sdp.units][0] == ""
    with pytest.raises(RuntimeError, match="ShardedDataParallel already relies on them"):
        opt.shard_parameters([_trainable(model)])
    with pytest.raises(RuntimeError, match="already has a ShardedDataParallel"):
        ShardedDataParallel(model, opt, stage=2)
    sdp.close()

    model = tricky.build()  # (the wrapped one's parameters stay sharded: their storage is freed)
    stepped = ShardedOptimizer(_trainable(model), optim=torch.optim.AdamW)
    stepped.step()
    with pytest.raises(RuntimeError, match="has stepped or loaded a state dict"):
        ShardedDataParallel(model, stepped, stage=3)
    fresh = ShardedOptimizer(_trainable(model), optim=torch.optim.AdamW)
    with pytest.raises(ValueError, match="1 of 6 are in no unit"):
        fresh.shard_parameters([_trainable(model)[1:]])


def test_stage3_errors_name_what_is_wrong() -> None:
    run_simulated_here(_errors, 2)


def test_prefetch_predicts_from_the_last_forward() -> None:
    """Forward prefetches the unit that followed, backward the one that preceded; a unit run
    twice keeps its first successor and last predecessor; nothing is predicted before a
    forward has finished."""
    from shardbench.strategies.sharded.prefetch import UnitOrder

    order = UnitOrder()
    order.start()
    for u in (1, 2, 3, 2, 4):
        order.ran(u)
    assert order.first() is None and order.after(1) is None  # still running
    order.finish()
    assert order.first() == 1
    assert [order.after(u) for u in (1, 2, 3, 4)] == [2, 3, 2, None]
    assert [order.before(u) for u in (1, 2, 3, 4)] == [None, 3, 2, 2]


def test_gloo_reduces_to_owners_from_four_ranks() -> None:
    """gloo: all-reduce below GLOO_REDUCE_FROM ranks (faster there), each chunk reduced to its
    owner from it on (half the bytes, faster there); every other backend reduce-scatters. The
    prediction's declared communication follows the same rule."""
    from shardbench.metrics.analytic import GLOO_REDUCE_FROM, Communication
    from shardbench.strategies.sharded.reducer import default_collective

    sizes = (2, 3, GLOO_REDUCE_FROM, 8)
    expected = ["all_reduce", "all_reduce", "reduce", "reduce"]
    assert [default_collective("gloo", n) for n in sizes] == expected
    declared = Communication(reducer_backend="gloo", gradient_bytes=4)
    assert [declared.gradient_collective(n) for n in sizes] == expected
    assert {default_collective(b, n) for b in ("nccl", "fake") for n in (2, 8)} == {"reduce_scatter"}


class _TwoHeads(nn.Module):
    """``a`` used by every rank, ``b`` by rank 0 only, ``c`` by none."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, rank: int) -> torch.Tensor:
        y = self.a(x)
        return (self.b(y) if rank == 0 else y).sum()


def _count_all_reduces(rank: int, world_size: int) -> tuple[int, list[bool]]:
    import torch.distributed as dist

    torch.manual_seed(0)
    model = _TwoHeads()
    opt = ShardedOptimizer(model.parameters(), optim=torch.optim.AdamW, bucket_cap_mb=1e-4)
    ddp = ShardedDataParallel(model, opt, stage=2)
    calls = []
    real = dist.all_reduce

    def counting(tensor: torch.Tensor, *args, **kwargs):
        calls.append(tensor.numel())
        return real(tensor, *args, **kwargs)

    dist.all_reduce = counting
    try:
        ddp(torch.ones(2, 4), rank).backward()
    finally:
        dist.all_reduce = real
    reducer = ddp.reducer
    used = [reducer.received_gradient(b.index, i) for b in opt.buckets for i in range(len(b.params))]
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for b in opt.buckets for p in b.params]
    ddp.close()
    return len(calls) - len(opt.buckets), [u for n, u in sorted(zip(order, used, strict=True))]


def test_zero2_on_gloo_sends_the_used_flags_inside_its_last_bucket() -> None:
    """At N=2 on gloo zero2 all-reduces its buckets; the "received a gradient" flags ride in the
    last one, so a step issues one all-reduce per bucket and none more, and a parameter one rank
    used is still stepped on every rank while one no rank used is not."""
    from tests.dist import run_in_world

    for extra, used in run_in_world(_count_all_reduces, 2):
        assert extra == 0
        assert used == [True, True, True, True, False, False]  # a.bias, a.weight, b.*, c.*
