"""Exact accounting of what each rank holds: balanced to the element, with one embedding that is
most of the model (where whole-parameter partitions put ~all state on one rank); for stage 3,
parameters too, and no unit's full buffer outlives its use."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from shardbench.strategies.sharded import ShardedDataParallel, ShardedOptimizer
from shardbench.strategies.sharded.layout import build_buckets
from tests import tricky
from tests.dist import run_in_world, run_simulated_here

BIG_VOCAB = 5000  # embedding 80,000 of 85,544 trainable elements


def _holdings(rank: int, world_size: int, cap_mb: float) -> dict:
    model = tricky.build(BIG_VOCAB)
    opt = ShardedOptimizer(tricky.param_groups(model), optim=torch.optim.AdamW, bucket_cap_mb=cap_mb)
    sdp = ShardedDataParallel(model, opt)
    batch = tricky.rank_slice(tricky.global_batch(0, 4, vocab=BIG_VOCAB), rank, world_size)
    opt.zero_grad(set_to_none=True)
    tricky.loss(sdp, batch, 0).backward()
    full_grads = sum(p.grad.numel() for p in model.parameters() if p.grad is not None)
    grad_bytes = sum(g.numel() * g.element_size() for g in sdp.memory_tensors()["grads"])
    opt.step()
    state_bytes = sum(
        v.numel() * v.element_size()
        for st in opt.state.values()
        for v in st.values()
        if torch.is_tensor(v) and v.dim() > 0
    )
    owned = sum(pc.numel for b in opt.buckets for pc in b.pieces)
    return {
        "full_grads": full_grads,
        "grad_bytes": grad_bytes,
        "state_bytes": state_bytes,
        "owned": owned,
        "chunks": sum(b.chunk for b in opt.buckets),
        "buckets": len(opt.buckets),
        "max_bucket": max(b.padded for b in opt.buckets),
    }


def test_each_rank_holds_its_partition_at_n4() -> None:
    total = sum(p.numel() for p in tricky.build(BIG_VOCAB).parameters() if p.requires_grad)
    cap_mb = 0.05  # ~13k elements: several buckets, the embedding alone in one
    ranks = run_in_world(_holdings, 4, cap_mb)
    assert sum(r["owned"] for r in ranks) == total  # every element owned exactly once
    for r in ranks:
        assert r["full_grads"] == 0  # no full gradient survives backward
        assert r["grad_bytes"] == 4 * r["chunks"]  # fp32 gradient shards = own chunks
        assert r["state_bytes"] == 8 * r["owned"]  # AdamW exp_avg + exp_avg_sq, own elements only
        # balanced to the element: within 1% of total/N plus padding (< N per bucket)
        assert r["owned"] <= total / 4 * 1.01 + r["buckets"] * 3
        assert r["grad_bytes"] <= 4 * (total / 4 * 1.01) + 4 * r["max_bucket"]


def _full_bytes(sdp: ShardedDataParallel) -> int:
    """Bytes held now by the flat buffers, trainable and frozen, in which stage 3 gathers whole
    units."""
    flats = [*sdp.optimizer.flats, *sdp.gatherer.frozen.flats]
    return sum(flat.untyped_storage().nbytes() for flat in flats)


def _stage3_holdings(rank: int, world_size: int, prefetch: bool) -> dict:
    model = tricky.build(BIG_VOCAB)
    opt = ShardedOptimizer(tricky.param_groups(model), optim=torch.optim.AdamW)
    sdp = ShardedDataParallel(model, opt, stage=3, unit=tricky.child_units(model), prefetch=prefetch)
    most_gathered = 0
    gather = sdp.gatherer.gather

    def counting_gather(u: int, **kw) -> None:
        nonlocal most_gathered
        gather(u, **kw)
        most_gathered = max(most_gathered, len(sdp.gathered_units()))

    sdp.gatherer.gather = counting_gather  # type: ignore[method-assign]
    out: dict = {"full_bytes": []}
    for step in range(3):  # the branch (a unit) is used on steps 0 and 2, not on step 1
        batch = tricky.rank_slice(tricky.global_batch(step, 4, vocab=BIG_VOCAB), rank, world_size)
        opt.zero_grad(set_to_none=True)
        loss = tricky.loss(sdp, batch, step)
        out["full_bytes"].append((_full_bytes(sdp), sdp.gathered_units()))  # the root only
        loss.backward()
        out["full_bytes"].append((_full_bytes(sdp), sdp.gathered_units()))
        # no full gradient either: none held, none in a buffer or a reduction in flight
        assert sdp.idle()
        opt.step()
        out["full_bytes"].append((_full_bytes(sdp), sdp.gathered_units()))
    root = sum(b.padded * 4 for b, u in zip(opt.buckets, sdp.gatherer.unit_of_bucket, strict=True) if u == 0)
    out |= {
        "root_bytes": root,
        "most_gathered": most_gathered,
        "full_grads": sum(p.grad.numel() for p in model.parameters() if p.grad is not None),
        # each chunk is a tensor of its own: holding it keeps no whole buffer alive
        "param_bytes": sum(c.untyped_storage().nbytes() for c in opt.chunks),
        "frozen_bytes": sum(c.untyped_storage().nbytes() for c in sdp.gatherer.frozen.chunks),
        "frozen_grads": [p.grad for p in model.frozen.parameters()],
        "grad_bytes": sum(g.untyped_storage().nbytes() for g in sdp.memory_tensors()["grads"]),
        "state_bytes": sum(
            v.untyped_storage().nbytes()
            for st in opt.state.values()
            for v in st.values()
            if torch.is_tensor(v) and v.dim() > 0
        ),
        "owned": sum(pc.numel for b in opt.buckets for pc in b.pieces),
        "chunks": sum(b.chunk for b in opt.buckets),
        "units": len(sdp.units),
        "buckets": len(opt.buckets),
    }
    # eval: a forward under no_grad gathers each unit and keeps nothing; it computes what a
    # plain model with the consolidated weights computes
    full = sdp.full_state_dict()
    sdp.eval()
    with torch.no_grad():
        logits = sdp(batch["tokens"], True)
    out["after_eval"] = (_full_bytes(sdp), sdp.gathered_units())
    plain = tricky.build(BIG_VOCAB)
    plain.load_state_dict(full)
    with torch.no_grad():
        out["eval_diff"] = (plain.eval()(batch["tokens"], True) - logits).abs().max().item()
    sdp.close()
    return out


@pytest.mark.parametrize("prefetch", [True, False])
def test_stage3_each_rank_holds_only_its_chunks_at_n4(prefetch: bool) -> None:
    """Between uses a rank holds its chunk of every unit (parameters, gradient shard, AdamW
    state: 16 bytes per owned element), nothing more than one unit's padding beyond total/N;
    the forward leaves only the root gathered (backward starts with it), backward and the
    step nothing, and besides the root at most one unit is ever whole, or two with prefetch
    (one running, the next gathering), also when the prefetch guessed a skipped unit."""
    n = 4
    total = sum(p.numel() for p in tricky.build(BIG_VOCAB).parameters() if p.requires_grad)
    ranks = run_in_world(_stage3_holdings, n, prefetch)
    assert sum(r["owned"] for r in ranks) == total  # every element owned exactly once
    frozen = sum(p.numel() for p in tricky.build(BIG_VOCAB).frozen.parameters())
    for r in ranks:
        assert r["units"] == 5  # root (the tied embedding/head weight), frozen, body, branch, head
        forward, backward, step = r["full_bytes"][:3]
        assert forward == (r["root_bytes"], [""]) and backward == step == (0, [])
        assert r["full_bytes"][3:] == [forward, backward, step] * 2  # with or without the branch
        assert r["most_gathered"] == (3 if prefetch else 2)
        assert r["full_grads"] == 0
        assert r["param_bytes"] == r["grad_bytes"] == 4 * r["chunks"]
        # the frozen layer: its chunk only (one bucket, padded to N), and never a gradient
        assert r["frozen_bytes"] == 4 * -(-frozen // n) and r["frozen_grads"] == [None, None]
        assert r["state_bytes"] == 8 * r["owned"]
        # balanced to the element: total/N plus under N padding elements per bucket
        assert r["owned"] <= r["chunks"] < total / n + r["buckets"]
        assert r["after_eval"] == (0, [])
        assert r["eval_diff"] < 1e-6


def test_whole_parameter_partition_would_be_unbalanced() -> None:
    """What element balance buys here: the embedding alone is 94% of the model, so any
    whole-parameter partition gives one rank >= 3.7x its share at N=4."""
    params = [p for p in tricky.build(BIG_VOCAB).parameters() if p.requires_grad]
    total = sum(p.numel() for p in params)
    assert max(p.numel() for p in params) / (total / 4) > 3.7
    buckets = build_buckets(params, world_size=4, rank=3, cap_numel=10**9)
    assert sum(pc.numel for pc in buckets[0].pieces) <= -(-total // 4)


def _simulated_holdings(rank: int, world_size: int) -> dict:
    return _holdings(rank, world_size, 25.0)


def test_fake_process_group_simulates_a_large_world() -> None:
    """This process as rank 0 of 64 (collectives move no data): real per-rank memory."""
    total = sum(p.numel() for p in tricky.build(BIG_VOCAB).parameters() if p.requires_grad)
    r = run_simulated_here(_simulated_holdings, 64)
    assert r["owned"] == -(-total // 64)
    assert r["state_bytes"] == 8 * r["owned"] and r["full_grads"] == 0


def test_refuses_optimizers_that_are_not_elementwise() -> None:
    class LAMB(torch.optim.Optimizer):  # a trust ratio needs whole-tensor norms
        def __init__(self, params, lr=1e-3):
            super().__init__(params, {"lr": lr})

    with pytest.raises(ValueError, match="LAMB.*Allowed: SGD, Adam, AdamW"):
        ShardedOptimizer([nn.Parameter(torch.ones(2))], optim=LAMB)


#: the collectives that pass our ZeRO's own buffers (its reductions' and the forward's buffer
#: broadcast's), each held on after completion by ``_held_after_wait``
_HELD = ("all_reduce", "reduce_scatter_tensor", "reduce", "broadcast")


@pytest.mark.parametrize(
    "strategy, collective",
    [("zero2", "all_reduce"), ("zero2", "reduce_scatter"), ("zero3", "all_reduce")],
)
def test_the_peak_does_not_depend_on_when_a_collective_lets_go(strategy, collective, monkeypatch) -> None:
    """A finished collective's tensors are still held by its work until the process group's own
    thread lets go of it (gloo's worker thread needs the GIL to drop them): on a loaded machine
    that came after the next gradient shard was allocated, and the peak was higher by a whole
    bucket. Here every collective's tensors are held until the next step clears its gradients, as
    by a thread that gets to run only then: the peak and what holds it are the same bytes as when
    they are let go at once, for gloo's all-reduce at N=2 (the used-gradient flags in its last
    bucket), the reduce-scatter of other backends and stage 3 (the flags in an all-reduce of
    their own). (Each chunk reduced to its owner, gloo's from N=4, frees as the all-reduce does.)"""
    import torch.distributed as dist

    from shardbench.strategies.sharded import data_parallel
    from tests.cells import run_cell_here, tiny_cell

    monkeypatch.setattr(data_parallel, "default_collective", lambda backend, world_size: collective)
    cell = tiny_cell(strategy=strategy, simulate=True, steps=1, warmup=0)
    prompt = run_cell_here(cell)
    held: list[tuple] = []
    calls = []

    def _held_after_wait(call):
        def holding(*args, **kwargs):
            work = call(*args, **kwargs)
            held.append((args, kwargs, work))
            calls.append(call)
            return work

        return holding

    for name in _HELD:
        monkeypatch.setattr(dist, name, _held_after_wait(getattr(dist, name)))
    zero_grad = ShardedOptimizer.zero_grad

    def let_go_then_zero_grad(self, set_to_none: bool = True) -> None:
        held.clear()
        zero_grad(self, set_to_none)

    monkeypatch.setattr(ShardedOptimizer, "zero_grad", let_go_then_zero_grad)
    late = run_cell_here(cell)
    assert prompt.status == late.status == "ok", (prompt.error, late.error)
    assert prompt.strategy_settings["gradient_reduction"] == collective
    assert len(calls) >= 6  # a timed step and two measured ones, each reducing every bucket
    assert late.peak_mem_bytes == prompt.peak_mem_bytes
    assert late.mem_breakdown_bytes == prompt.mem_breakdown_bytes
