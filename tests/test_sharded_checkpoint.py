"""Checkpoints: consolidated on one rank in the plain optimizer's format, loadable into the plain
optimizer, and re-shardable to another world size (4 -> 2)."""

from __future__ import annotations

import copy

import torch

from bench.strategies.sharded import ShardedDataParallel, ShardedOptimizer
from tests import tricky
from tests.dist import run_in_world
from tests.parity import max_rel_diff

CHUNKS, FIRST, TOTAL = 4, 3, 5


def _first_phase(rank: int, world_size: int):
    model = tricky.build()
    opt = ShardedOptimizer(tricky.param_groups(model), optim=torch.optim.AdamW, bucket_cap_mb=0.001)
    tricky.train_sharded_steps(ShardedDataParallel(model, opt), opt, range(FIRST), rank, world_size, CHUNKS)
    opt.consolidate_state_dict(to=0)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, (
        opt.state_dict() if rank == 0 else None
    )


def _second_phase(rank: int, world_size: int, model_state, opt_state):
    model = tricky.build()
    model.load_state_dict(model_state)
    opt = ShardedOptimizer(tricky.param_groups(model), optim=torch.optim.AdamW, bucket_cap_mb=0.002)
    opt.load_state_dict(opt_state)
    tricky.train_sharded_steps(
        ShardedDataParallel(model, opt), opt, range(FIRST, TOTAL), rank, world_size, CHUNKS
    )
    return tricky.state(model)


def _plain(steps, model=None, opt=None):
    model = model or tricky.build()
    opt = opt or torch.optim.AdamW(tricky.param_groups(model))
    for step in steps:
        opt.zero_grad(set_to_none=True)
        tricky.loss(model, tricky.global_batch(step, CHUNKS), step).backward()
        opt.step()
    return model, opt


def test_round_trip_into_plain_optimizer_and_reshard_4_to_2() -> None:
    (model_state, sd), *_ = run_in_world(_first_phase, 4)
    ref_model, ref_opt = _plain(range(FIRST))
    # same format and values as the plain optimizer's own state dict
    ref_sd = ref_opt.state_dict()
    assert sd["param_groups"] == ref_sd["param_groups"]
    assert sd["state"].keys() == ref_sd["state"].keys()
    for idx, st in ref_sd["state"].items():
        for k, v in st.items():
            assert torch.allclose(sd["state"][idx][k], v, rtol=1e-5, atol=1e-9), (idx, k)
    # the plain optimizer resumes from it
    resumed = tricky.build()
    resumed.load_state_dict(model_state)
    plain_opt = torch.optim.AdamW(tricky.param_groups(resumed))
    plain_opt.load_state_dict(copy.deepcopy(sd))  # torch's load aliases same-dtype state tensors
    _plain(range(FIRST, TOTAL), resumed, plain_opt)
    reference = tricky.state(_plain(range(TOTAL))[0])
    assert max_rel_diff(tricky.state(resumed), reference)[0] < 1e-6
    # and a ShardedOptimizer at world size 2 resumes from it
    for st in run_in_world(_second_phase, 2, model_state, sd):
        diff, where = max_rel_diff(st, reference)
        assert diff < 1e-6, f"{where} off by {diff:.2e} after resharding 4 -> 2"
