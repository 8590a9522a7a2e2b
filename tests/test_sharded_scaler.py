"""fp16 loss scaling over our ZeRO: torch's AMP loop with ``ShardedGradScaler``, at stages 1-3 (and
stage 1 as plain DDP over a ``ShardedOptimizer``) on 2, 3 and 4 gloo ranks.

Each rank trains the tricky model (tied head, frozen layer, a branch unused on odd steps, and a
one-element parameter in a group of its own, so that most ranks own nothing of it) under
``torch.autocast("cpu", dtype=torch.float16)``, unscaling before clipping. At one step a single
element of one rank's gradient is set to inf: after the reduction only the rank that owns that
element sees it, and every rank must skip that step and back off to the same scale. Each rank
also trains the single-process reference (torch's own ``GradScaler`` over the whole batch, the
same inf in the same element) and the two must end with the same parameters and scale.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from shardbench.strategies.sharded import ShardedDataParallel, ShardedGradScaler, ShardedOptimizer
from tests import tricky
from tests.dist import run_in_world
from tests.parity import max_rel_diff

STEPS, OVERFLOW_STEP = 5, 2
SCALER = {"init_scale": 2.0**12, "growth_interval": 2}


class ScaledNet(tricky.TrickyNet):
    def __init__(self) -> None:
        super().__init__()
        self.temperature = nn.Parameter(torch.ones(1))

    def forward(self, tokens: torch.Tensor, use_branch: bool) -> torch.Tensor:
        return super().forward(tokens, use_branch) * self.temperature


def _build() -> ScaledNet:
    torch.manual_seed(0)
    return ScaledNet()


def _groups(model: ScaledNet) -> list[dict]:
    groups = tricky.param_groups(model)
    groups[1]["params"] = [p for p in groups[1]["params"] if p is not model.temperature]
    return [*groups, {"params": [model.temperature], "lr": 3e-4, "weight_decay": 0.0}]


def _poison(grad: torch.Tensor) -> torch.Tensor:
    grad = grad.clone()
    grad.view(-1)[0] = float("inf")
    return grad


def _loss(model: nn.Module, batch: dict, step: int) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.float16):
        logits = model(batch["tokens"], step % 2 == 0)
    return F.cross_entropy(logits.float(), batch["labels"])


def _sharded(rank: int, world_size: int, stage: str) -> tuple[dict, list[float]]:
    model = _build()
    opt = ShardedOptimizer(_groups(model), optim=torch.optim.AdamW, bucket_cap_mb=0.0005)
    if stage == "ddp":
        wrapped: nn.Module = DistributedDataParallel(model, find_unused_parameters=True)
    else:  # "3" or, hybrid, "3@2": stage 3 sharded within groups of 2 ranks
        level, _, shard = stage.partition("@")
        wrapped = ShardedDataParallel(
            model, opt, stage=int(level), shard_group_size=int(shard) if shard else None
        )
    scaler = ShardedGradScaler("cpu", **SCALER)
    scales = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        handle = None
        if step == OVERFLOW_STEP and rank == world_size - 1:  # one element of one rank's gradient
            handle = model.body.weight.register_hook(_poison)
        batch = tricky.rank_slice(tricky.global_batch(step, 4), rank, world_size)
        scaler.scale(_loss(wrapped, batch, step)).backward()
        if handle is not None:
            handle.remove()
        scaler.unscale_(opt)
        opt.clip_grad_norm_(1.0)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    state = tricky.state(wrapped.module if stage == "ddp" else wrapped)
    if stage != "ddp":
        wrapped.close()
    return state, scales


def _reference(world_size: int) -> tuple[dict, list[float]]:
    """One process, the whole batch: the mean of the ranks' slice losses (each computed as the
    rank computes it), torch's own scaler, the same inf in the same element."""
    model = _build()
    opt = torch.optim.AdamW(_groups(model))
    scaler = torch.amp.GradScaler("cpu", **SCALER)
    scales = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        handle = model.body.weight.register_hook(_poison) if step == OVERFLOW_STEP else None
        batch = tricky.global_batch(step, 4)
        loss = sum(_loss(model, tricky.rank_slice(batch, r, world_size), step) for r in range(world_size))
        scaler.scale(loss / world_size).backward()
        if handle is not None:
            handle.remove()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return tricky.state(model), scales


def _both(rank: int, world_size: int, stages: list[str]) -> dict:
    out = {stage: _sharded(rank, world_size, stage) for stage in stages}
    out["reference"] = _reference(world_size)
    return out


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_an_overflow_on_one_rank_skips_the_step_everywhere(world_size: int) -> None:
    stages = ["ddp", "1", "2", "3", *(["1@2", "2@2", "3@2"] if world_size == 4 else [])]
    ranks = run_in_world(_both, world_size, stages, timeout_s=240)
    ref_state, ref_scales = ranks[0]["reference"]
    # the scaler backed off at the overflow (and grew every 2 clean steps): the test can fail
    assert ref_scales[OVERFLOW_STEP] == ref_scales[OVERFLOW_STEP - 1] / 2, ref_scales
    untrained = tricky.state(_build())
    assert max_rel_diff(untrained, ref_state)[0] > 1e-3  # the reference trained
    for stage in stages:
        for rank, out in enumerate(ranks):
            state, scales = out[stage]
            assert scales == ref_scales, f"stage {stage} rank {rank}: scales {scales} != {ref_scales}"
            diff, name = max_rel_diff(state, ref_state)
            assert diff < 1e-4, f"stage {stage} rank {rank}, N={world_size}: {name} differs by {diff:.2e}"


def _plain_overflow(rank: int, world_size: int) -> list[float]:
    """The scaler with an optimizer of its own (not sharded): the agreement still holds."""
    model = _build()
    opt = torch.optim.AdamW(_groups(model))
    scaler = ShardedGradScaler("cpu", **SCALER)
    scales = []
    for step in range(3):
        opt.zero_grad(set_to_none=True)
        handle = model.body.weight.register_hook(_poison) if step == 1 and rank == 0 else None
        scaler.scale(_loss(model, tricky.global_batch(step, 1), step)).backward()
        if handle is not None:
            handle.remove()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


def test_an_unsharded_optimizer_agrees_too() -> None:
    scales = run_in_world(_plain_overflow, 2)
    assert scales[0] == scales[1] and scales[0][1] == scales[0][0] / 2, scales
