"""Hybrid sharding in our ZeRO (``shard_group_size`` S): each stage shards within groups of S
consecutive ranks and replicates across the N/S groups, and trains to plain AdamW in one process
on the same global batch (N = 4 with S = 1 and 2, N = 6 with S = 2 and 3), gradient
accumulation and clipping included; each rank keeps 1/S of what is sharded; an S that does not
divide N is refused in one line."""

from __future__ import annotations

import pytest
import torch

from shardbench.strategies.sharded import ShardedDataParallel, ShardedOptimizer
from tests import tricky
from tests.dist import run_in_world
from tests.parity import max_rel_diff

STEPS, MICRO, CHUNKS, CLIP = 4, 2, 12, 0.05  # 12 chunks: 2, 4 and 6 ranks split them evenly


def reference() -> dict[str, torch.Tensor]:
    """One process, the global batch as ``MICRO`` micro-batches whose gradients add up."""
    model = tricky.build()
    opt = torch.optim.AdamW(tricky.param_groups(model))
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        for micro in range(MICRO):
            tricky.loss(model, tricky.global_batch(step * MICRO + micro, CHUNKS), step).backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], CLIP)
        opt.step()
    return tricky.state(model)


def train_hybrid(rank: int, world_size: int, stage: int, shard: int) -> tuple[dict[str, torch.Tensor], dict]:
    model = tricky.build()
    opt = ShardedOptimizer(tricky.param_groups(model), optim=torch.optim.AdamW, bucket_cap_mb=0.0005)
    options = {"unit": tricky.child_units(model)} if stage == 3 else {}
    wrapped = ShardedDataParallel(model, opt, stage=stage, shard_group_size=shard, **options)
    reducer, launch = wrapped.reducer, wrapped.reducer.launch
    overlapped = []  # per launch: how many replicas' all-reduces were still running beside it

    def counting_launch(bucket):
        launch(bucket)
        overlapped.append(len(reducer._across))

    reducer.launch = counting_launch
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        for micro in range(MICRO):  # accumulated: each pass reduced, the sums added
            batch = tricky.rank_slice(tricky.global_batch(step * MICRO + micro, CHUNKS), rank, world_size)
            tricky.loss(wrapped, batch, step).backward()
        opt.clip_grad_norm_(CLIP)
        opt.step()
    layout = {
        "chunk_ranks": opt.world_size,
        "replicas": wrapped.replicas,
        "chunk_elements": sum(c.numel() for c in opt.chunks),
        "bucket_elements": sum(b.padded for b in opt.buckets),
        "launches_beside_an_across_reduce": sum(n > 0 for n in overlapped),
    }
    return tricky.state(wrapped if stage == 3 else model), layout


@pytest.mark.parametrize(("stage", "shard"), [(1, 2), (2, 2), (3, 2), (2, 1)])
def test_hybrid_matches_single_process_adamw(stage: int, shard: int) -> None:
    ref = reference()
    results = run_in_world(train_hybrid, 4, stage, shard)
    for rank, (state, layout) in enumerate(results):
        diff, where = max_rel_diff(state, ref)
        assert diff < 1e-6, f"stage {stage} N=4 S={shard} rank {rank}: {where} off by {diff:.2e}"
        assert layout["chunk_ranks"] == shard and layout["replicas"] == 4 // shard
        assert layout["chunk_elements"] * shard == layout["bucket_elements"]  # 1/S of every bucket
        # the replicas' all-reduce of a bucket runs while later buckets are launched in backward
        assert layout["launches_beside_an_across_reduce"] > 0 or shard == 4


def test_hybrid_at_six_ranks_matches_single_process_adamw() -> None:
    """N = 6 in shard groups of 2 (three replicas) and of 3 (two), at every stage."""
    ref = reference()
    for shard in (2, 3):
        for stage in (1, 2, 3):
            for rank, (state, layout) in enumerate(run_in_world(train_hybrid, 6, stage, shard)):
                diff, where = max_rel_diff(state, ref)
                assert diff < 1e-6, f"stage {stage} N=6 S={shard} rank {rank}: {where} off by {diff:.2e}"
                assert layout["chunk_ranks"] == shard and layout["replicas"] == 6 // shard


def _refused(rank: int, world_size: int, shards: list[object]) -> list[str]:
    lines = []
    for shard in shards:
        model = tricky.build()
        opt = ShardedOptimizer(tricky.param_groups(model), optim=torch.optim.AdamW)
        try:
            ShardedDataParallel(model, opt, stage=2, shard_group_size=shard)
        except ValueError as e:
            lines.append(str(e))
    return lines


def test_a_shard_size_that_does_not_divide_the_world_is_refused() -> None:
    shards = [3, 0, 8, 2.0]
    for lines in run_in_world(_refused, 4, shards):
        assert lines == [
            f"shard_group_size must divide the world of 4 ranks, got {s!r}; allowed: 1, 2, 4" for s in shards
        ]


CKPT_CHUNKS, FIRST, TOTAL = 4, 2, 4


def _save(rank: int, world_size: int, stage: int, shard: int):
    model = tricky.build()
    opt = ShardedOptimizer(tricky.param_groups(model), optim=torch.optim.AdamW, bucket_cap_mb=0.001)
    options = {"unit": tricky.child_units(model)} if stage == 3 else {}
    sdp = ShardedDataParallel(model, opt, stage=stage, shard_group_size=shard, **options)
    tricky.train_sharded_steps(sdp, opt, range(FIRST), rank, world_size, CKPT_CHUNKS)
    opt.consolidate_state_dict(to=0)
    model_state = sdp.full_state_dict() if stage == 3 else model.state_dict()
    return {k: v.detach().clone() for k, v in model_state.items()}, (opt.state_dict() if rank == 0 else None)


def _resume(rank: int, world_size: int, model_state, opt_state, stage: int, shard: int | None):
    model = tricky.build()
    model.load_state_dict(model_state)
    opt = ShardedOptimizer(tricky.param_groups(model), optim=torch.optim.AdamW, bucket_cap_mb=0.002)
    options = {"unit": tricky.child_units(model)} if stage == 3 else {}
    sdp = ShardedDataParallel(model, opt, stage=stage, shard_group_size=shard, **options)
    opt.load_state_dict(opt_state)
    tricky.train_sharded_steps(sdp, opt, range(FIRST, TOTAL), rank, world_size, CKPT_CHUNKS)
    return tricky.state(sdp if stage == 3 else model)


def test_a_hybrid_checkpoint_loads_at_another_shard_width_and_world() -> None:
    """Stage 3 (its model consolidated by ``full_state_dict``), saved at N = 4, S = 2; resumed at
    N = 2 (S = 2, the whole world) and N = 4, S = 4."""
    stage = 3
    (model_state, saved), *_ = run_in_world(_save, 4, stage, 2)
    reference = tricky.build()
    opt = torch.optim.AdamW(tricky.param_groups(reference))
    for step in range(TOTAL):
        opt.zero_grad(set_to_none=True)
        tricky.loss(reference, tricky.global_batch(step, CKPT_CHUNKS), step).backward()
        opt.step()
    expected = tricky.state(reference)
    for world, shard in ((2, 2), (4, 4)):
        for state in run_in_world(_resume, world, model_state, saved, stage, shard):
            diff, where = max_rel_diff(state, expected)
            assert diff < 1e-6, f"stage {stage} resumed at N={world} S={shard}: {where} off by {diff:.2e}"


LOOP_VARIANTS = [(False, False), (False, True), (True, False)]  # (live param group, no_sync accumulation)


def _in_any_loop(rank: int, world_size: int, stage: int, shard: int) -> dict:
    from tests import loop_scenarios as sc

    plain = sc.wrap
    sc.wrap = lambda model, opt, stage: ShardedDataParallel(model, opt, stage=stage, shard_group_size=shard)
    try:
        return {
            (live, acc): sc.train_sharded(rank, world_size, stage, live_group=live, accumulate=acc)
            for live, acc in LOOP_VARIANTS
        }
    finally:
        sc.wrap = plain  # the world's processes serve other tests after this one


def test_hybrid_stage_3_keeps_what_any_loop_relies_on() -> None:
    """The in-any-loop scenarios at N = 4, S = 2: ranks that initialised their own weights start
    from rank 0's, a frozen embedding unfrozen mid-run (in the optimizer from the start, or added
    as a live param group) trains from then on, no_sync accumulation, a closure, a scheduler and
    clipping under changing norms; each variant against one process."""
    from tests import loop_scenarios as sc

    results = run_in_world(_in_any_loop, 4, 3, 2, timeout_s=240)
    for live, acc in LOOP_VARIANTS:
        ref = sc.train_reference(4, live_group=live)
        for rank, by_variant in enumerate(results):
            diff, where = max_rel_diff(by_variant[(live, acc)], ref)
            assert diff < 1e-5, f"live_group={live} accumulate={acc} rank {rank}: {where} off by {diff:.2e}"
