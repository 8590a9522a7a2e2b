"""Checkpoints: consolidated on one rank in the plain optimizer's format, loadable into the plain
optimizer, and re-shardable to another world size (4 -> 2), from stage 2 and from stage 3 (whose
model is consolidated by ``full_state_dict``)."""

from __future__ import annotations

import copy

import pytest
import torch

from shardbench.strategies.sharded import ShardedDataParallel, ShardedOptimizer
from tests import tricky
from tests.dist import run_in_world
from tests.parity import max_rel_diff

CHUNKS, FIRST, TOTAL = 4, 3, 5


def _wrap(model, opt: ShardedOptimizer, stage: int) -> ShardedDataParallel:
    unit = tricky.child_units(model) if stage == 3 else None
    return ShardedDataParallel(model, opt, stage=stage, **({"unit": unit} if unit else {}))


def _first_phase(rank: int, world_size: int, stage: int):
    model = tricky.build()
    opt = ShardedOptimizer(tricky.param_groups(model), optim=torch.optim.AdamW, bucket_cap_mb=0.001)
    sdp = _wrap(model, opt, stage)
    tricky.train_sharded_steps(sdp, opt, range(FIRST), rank, world_size, CHUNKS)
    opt.consolidate_state_dict(to=0)
    model_state = sdp.full_state_dict() if stage == 3 else model.state_dict()
    return {k: v.detach().clone() for k, v in model_state.items()}, (opt.state_dict() if rank == 0 else None)


def _second_phase(rank: int, world_size: int, model_state, opt_state, stage: int):
    model = tricky.build()
    model.load_state_dict(model_state)  # into the plain model, before any wrapper shards it
    opt = ShardedOptimizer(tricky.param_groups(model), optim=torch.optim.AdamW, bucket_cap_mb=0.002)
    sdp = _wrap(model, opt, stage)
    opt.load_state_dict(opt_state)  # stage 3: after wrapping, which re-packs the (stateless) buckets
    tricky.train_sharded_steps(sdp, opt, range(FIRST, TOTAL), rank, world_size, CHUNKS)
    return tricky.state(sdp if stage == 3 else model)


def _plain(steps, model=None, opt=None):
    model = model or tricky.build()
    opt = opt or torch.optim.AdamW(tricky.param_groups(model))
    for step in steps:
        opt.zero_grad(set_to_none=True)
        tricky.loss(model, tricky.global_batch(step, CHUNKS), step).backward()
        opt.step()
    return model, opt


@pytest.mark.parametrize("stage", [2, 3])
def test_round_trip_into_plain_optimizer_and_reshard_4_to_2(stage: int) -> None:
    (model_state, sd), *_ = run_in_world(_first_phase, 4, stage)
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
    for st in run_in_world(_second_phase, 2, model_state, sd, stage):
        diff, where = max_rel_diff(st, reference)
        assert diff < 1e-6, f"{where} off by {diff:.2e} after resharding 4 -> 2"
