"""Shared parity machinery: train a strategy on N ranks and a plain single-process reference on
the same global batch, and compare parameters.

The reference trains on the concatenation of every rank's chunk (``shardbench.models.base`` makes chunks
depend only on seed, step and rank), with a mean loss, so with exact arithmetic it computes
exactly what data parallelism computes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from shardbench.models.base import Workload, concat_inputs
from shardbench.models.registry import get_workload
from shardbench.strategies.base import RankContext
from shardbench.strategies.registry import get_strategy

SEED = 0


def _workload(w: str | Workload) -> Workload:
    return w if isinstance(w, Workload) else get_workload(w)


def _full(t: torch.Tensor) -> torch.Tensor:
    """A plain full tensor (FSDP2 state dicts hold sharded DTensors)."""
    full = getattr(t, "full_tensor", None)
    return (full() if full is not None else t).detach().clone()


def _unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)


def train_reference(
    workload_name: str | Workload,
    preset: str,
    world_size: int,
    steps: int,
    batch_size: int,
    optimizer_factory: Callable[..., torch.optim.Optimizer] | None = None,
    precision: str = "fp32",
) -> dict[str, torch.Tensor]:
    """``precision`` "fp16": PyTorch's documented recipe in one process, autocast to fp16 over
    fp32 parameters with ``torch.amp.GradScaler``."""
    workload = _workload(workload_name)
    torch.manual_seed(SEED)
    model = workload.build(preset, dropout=False)
    opt = (optimizer_factory or workload.optimizer_factory())(model)
    half = precision == "fp16"
    scaler = torch.amp.GradScaler("cpu") if half else None
    for step in range(steps):
        inputs = concat_inputs(
            [workload.batch(preset, batch_size, seed=SEED, step=step, rank=r) for r in range(world_size)]
        )
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16, enabled=half):
            loss = workload.loss(model, inputs)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_strategy_rank(
    rank: int,
    world_size: int,
    strategy_name: str,
    workload_name: str | Workload,
    preset: str,
    steps: int,
    batch_size: int,
    optimizer_factory: Callable[..., torch.optim.Optimizer] | None = None,
    activation_checkpointing: bool = False,
    precision: str = "fp32",
    shard_group: int | None = None,
) -> dict[str, Any]:
    """Run on each rank (inside tests.dist.run_distributed); returns the rank's final state
    (whole parameters: a wrapper that shards them consolidates them with ``full_state_dict``).
    At ``precision`` the strategy readies the model, autocasts and scales its loss as the
    harness has it do; ``shard_group``: hybrid sharding's S, as a cell gives it."""
    import torch.distributed as dist

    from shardbench.models.checkpointing import apply_activation_checkpointing

    workload = _workload(workload_name)
    strategy = get_strategy(strategy_name)
    torch.manual_seed(SEED)
    model = workload.build(preset, dropout=False)
    if activation_checkpointing:
        apply_activation_checkpointing(model, workload.checkpoint_units(model))
    ctx = RankContext(
        rank=rank,
        world_size=world_size,
        device=torch.device("cpu"),
        process_group=dist.group.WORLD,
        precision=precision,
        shard_group=shard_group,
    )
    model, autocast_dtype = strategy.prepare_precision(model, precision)
    model, opt = strategy.setup(model, optimizer_factory or workload.optimizer_factory(), ctx)
    strategy.scaler = strategy.loss_scaler(opt, ctx)

    def loss(model: nn.Module, inputs: Any) -> torch.Tensor:
        autocast = autocast_dtype is not None
        with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast):
            return workload.loss(model, inputs)

    for step in range(steps):
        inputs = workload.batch(preset, batch_size, seed=SEED, step=step, rank=rank)
        strategy.train_step(model, opt, inputs, loss)
    # a wrapper that shards parameters consolidates them: ours and FSDP2's model, or a peer's
    # strategy (DeepSpeed's engine keeps stage-3 partitions on the parameters themselves)
    full_state_dict = getattr(model, "full_state_dict", None) or getattr(strategy, "full_state_dict", None)
    state_dict = full_state_dict() if full_state_dict is not None else _unwrap(model).state_dict()
    state = {k: _full(v) for k, v in state_dict.items()}
    strategy.teardown()
    return state


def max_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, str]:
    """Largest per-tensor relative difference max|a-b| / max|b|, and the tensor it was in.

    Per tensor, not per element: Adam moves every element by ~lr whatever its size, so an element
    that happens to sit near zero would turn rounding noise into a huge elementwise ratio. The
    denominator is floored at 1% of the model's largest parameter magnitude, because some
    parameters (attention key biases) receive gradients that are pure rounding noise and stay
    near zero, where any ratio is meaningless.
    """
    assert a.keys() == b.keys(), set(a) ^ set(b)
    floats = [k for k in a if a[k].is_floating_point()]
    for k in set(a) - set(floats):
        assert torch.equal(a[k], b[k]), k
    scale = max(b[k].float().abs().max().item() for k in floats)
    worst, where = 0.0, ""
    for k in floats:
        denom = max(b[k].float().abs().max().item(), 1e-2 * scale, 1e-30)
        diff = (a[k].float() - b[k].float()).abs().max().item() / denom
        if diff > worst:
            worst, where = diff, k
    return worst, where


def max_rel_l2_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, str]:
    """Largest per-tensor ||a-b||_2 / ||b||_2, for low precision: there Adam turns gradient
    rounding noise into full-lr steps of flipped sign on a few elements, which a max-norm
    comparison reports as a whole-lr error; the L2 norm weighs them by how few they are."""
    worst, where = 0.0, ""
    for k in a:
        if a[k].is_floating_point():
            diff = ((a[k].float() - b[k].float()).norm() / b[k].float().norm().clamp_min(1e-30)).item()
            if diff > worst:
                worst, where = diff, k
    return worst, where
