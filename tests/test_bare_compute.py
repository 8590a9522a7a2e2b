"""The compute term timed on the model itself (``prediction/bare_compute.py``), the tensors an
optimizer steps over (``metrics/optimizer_tensors.py``) and the update's per-tensor cost."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

from shardbench.metrics.optimizer_tensors import stepped_tensors, stepping_optimizer
from shardbench.prediction import bare_compute
from shardbench.prediction.bare_compute import fits, time_forward_backward
from shardbench.prediction.step_time import StepInputs, predict_step
from shardbench.prediction.update_probe import probe_per_tensor
from tests.dist import run_in_world


class Counting(nn.Module):
    """A model that changes itself in forward, as real ones do: a Python count of its passes, a
    batch norm's running statistics and a parameter renormalised in place."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.norm = nn.BatchNorm1d(8)
        self.passes = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.passes += 1
        with torch.no_grad():
            self.linear.weight.div_(self.linear.weight.norm())
        return self.norm(torch.nn.functional.dropout(self.linear(x), 0.5))


def _loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).square().mean()


def test_timing_leaves_the_model_and_the_rng_as_they_were() -> None:
    torch.manual_seed(0)
    model = Counting()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.rand(4, 8)
    rng = torch.get_rng_state()
    out = time_forward_backward(model, _loss, x, device=torch.device("cpu"))
    assert model.passes == 0 and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng)
    assert out["seconds"] > 0 and out["threads"] == torch.get_num_threads()
    assert bare_compute.REPEATS[0] <= out["repeats"] <= bare_compute.REPEATS[1]


def test_passes_follow_the_slowest_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """The count of passes comes from ``agree``'s answer on the first, so ranks that agree make
    as many; and each timed pass counts as its slowest rank's time, as a synchronised step does."""
    monkeypatch.setattr(bare_compute, "BUDGET_S", 1.0)
    asked: list[float] = []

    def agree(seconds: float) -> float:
        asked.append(seconds)
        return max(seconds, 0.2)  # another rank's every pass takes 0.2 s: 5 fit in the budget

    out = time_forward_backward(Counting(), _loss, torch.rand(4, 8), device=torch.device("cpu"), agree=agree)
    assert out["repeats"] == 5 and len(asked) == 1 + 5  # the first pass, then each timed one
    assert all(t < 0.2 for t in asked)  # this rank's passes are the quicker: the other's count
    assert out["seconds"] == 0.2 and out["mad_seconds"] == 0.0
    slow = time_forward_backward(
        Counting(), _loss, torch.rand(4, 8), device=torch.device("cpu"), agree=lambda s: 60.0
    )
    assert slow["repeats"] == bare_compute.REPEATS[0]
    # never more passes than the cell times steps: a one-step cell's figure is one pass
    one = time_forward_backward(Counting(), _loss, torch.rand(4, 8), device=torch.device("cpu"), most=1)
    assert one["repeats"] == 1


def test_fits_counts_every_copy_and_its_gradients() -> None:
    model = nn.Linear(100, 100)  # 10,100 fp32 elements: 40,400 bytes
    assert fits(model, 2, None)
    assert fits(model, 2, 4 * 2 * 40_400)  # two copies and their gradients in half the memory
    assert not fits(model, 2, 4 * 2 * 40_400 - 1)


def _collective_loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A loss with a collective in it (SwAV's Sinkhorn sums over the ranks), then 0.1 s more on
    rank 1: its passes take ten times rank 0's."""
    total = model(x).sum().detach().reshape(1)
    dist.all_reduce(total)
    if dist.get_rank() == 1:
        time.sleep(0.1)
    return model(x).square().mean() + 0 * total.sum()


def _time_in_world(rank: int, world_size: int) -> tuple[int, dict]:
    from shardbench.harness.worker import _slowest

    def agree(seconds: float) -> float:
        return _slowest(dist.group.WORLD, seconds)

    x = torch.rand(4, 8)
    out = time_forward_backward(
        nn.Linear(8, 8), _collective_loss, x, device=torch.device("cpu"), agree=agree, world_size=world_size
    )
    return out["repeats"], out["collectives"]


def test_ranks_whose_loss_holds_collectives_make_as_many_passes() -> None:
    """Each rank times its own first pass; were each to size its passes from that (rank 0 would
    make 10, rank 1 3), a loss with a collective in it would leave rank 0 waiting for ever on
    a pass rank 1 never makes."""
    (repeats_0, own_0), (repeats_1, own_1) = run_in_world(_time_in_world, 2, timeout_s=60)
    assert repeats_0 == repeats_1 < bare_compute.REPEATS[1]  # rank 1's pass set both counts
    # the loss's own collective is counted (one 4-byte all-reduce a pass): the figure holds it,
    # so the step-time model leaves it out of the step's collectives
    assert own_0 == own_1 == {"all_reduce": {"calls": 1, "bytes": 4}}


class Wrapping(torch.optim.Optimizer):
    """A sharding wrapper's shape: the optimizer that steps is inside it, as ``local``."""

    def __init__(self, inner: torch.optim.Optimizer, params: list[nn.Parameter]) -> None:
        super().__init__(params, {})
        self.local = inner


def test_stepped_tensors_counts_the_innermost_optimizers_pieces() -> None:
    params = [nn.Parameter(torch.zeros(4)) for _ in range(5)]
    params[1].requires_grad_(False)
    empty = nn.Parameter(torch.zeros(0))  # a rank's empty piece: nothing to step
    plain = torch.optim.AdamW([*params, empty])
    assert stepped_tensors(plain) == 4
    pieces = [nn.Parameter(torch.zeros(2)) for _ in range(2)]
    wrapper = Wrapping(torch.optim.AdamW(pieces), params)
    assert stepping_optimizer(wrapper) is wrapper.local and stepped_tensors(wrapper) == 2
    assert stepped_tensors(object()) is None


def test_the_update_counts_a_fixed_cost_per_tensor() -> None:
    step = StepInputs(flops=0.0, rate=1.0, compute_s=0.01, update_elements=1000, seconds_per_element=1e-9)
    per_tensor = StepInputs(**{**step.__dict__, "update_tensors": 40, "seconds_per_tensor": 2e-5})
    profile_free = predict_step(step, _no_network())
    assert predict_step(per_tensor, _no_network())["update"] == pytest.approx(
        profile_free["update"] + 40 * 2e-5
    )


def test_the_per_tensor_probe_measures_a_positive_cost() -> None:
    out = probe_per_tensor(1)
    assert out["seconds_per_tensor"] > 0 and out["tensors"] > 1 and out["copies"] == 1


def _no_network():
    from shardbench.prediction.network_profiles import LinkCost, NetworkProfile

    return NetworkProfile("none", LinkCost(0.0, float("inf")), "no collectives", shares_compute=True)


def _fail_in_world(rank: int, world_size: int, failing_pass: int) -> bool:
    """Time a model whose loss raises on rank 1's ``failing_pass``-th pass only (a copy that runs
    out of memory there, say); whether this rank gave the figure up."""
    from shardbench.harness.worker import _slowest

    passes: list[int] = []

    def loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        passes.append(1)
        if rank == 1 and len(passes) == failing_pass:
            raise RuntimeError(f"rank 1's pass {failing_pass} fails")
        return model(x).square().mean()

    def agree(seconds: float) -> float:
        return _slowest(dist.group.WORLD, seconds)

    out = time_forward_backward(
        nn.Linear(8, 8), loss, torch.rand(4, 8), device=torch.device("cpu"), agree=agree
    )
    dist.all_reduce(torch.ones(1))  # the next collective both ranks make pairs up: none is left behind
    return out is None


@pytest.mark.parametrize("failing_pass", [1, 3], ids=["the untimed first pass", "a timed pass"])
def test_a_rank_that_fails_a_pass_makes_every_rank_give_the_figure_up(failing_pass: int) -> None:
    """Rank 1 fails a pass, rank 0 does not: rank 0 must not go on timing (its next collective
    would pair with whatever rank 1 does next); both give the figure up together."""
    assert run_in_world(_fail_in_world, 2, failing_pass, timeout_s=60) == [True, True]


def test_the_collectives_a_loss_issues_itself_are_not_costed_twice() -> None:
    """A bare pass holds its loss's collectives (SwAV's Sinkhorn sums); the step counted them
    too, beside its gradients': they leave the count, and a kind with none left goes."""
    from shardbench.prediction.record_step_time import _less_the_loss_own

    step = {"all_reduce": {"calls": 9, "bytes": 1000}, "broadcast": {"calls": 1, "bytes": 8}}
    loss_own = {"all_reduce": {"calls": 8, "bytes": 64}}
    assert _less_the_loss_own(step, loss_own) == {
        "all_reduce": {"calls": 1, "bytes": 936},
        "broadcast": {"calls": 1, "bytes": 8},
    }
    assert _less_the_loss_own(step, {"broadcast": {"calls": 1, "bytes": 8}}) == {
        "all_reduce": {"calls": 9, "bytes": 1000}
    }
    assert _less_the_loss_own(step, {}) == step


def test_a_prediction_from_the_bare_pass_leaves_the_losss_own_collectives_out() -> None:
    """ddp on gloo: its gradients' all-reduce takes its calls from the step's count, which also
    holds the loss's own 8; from the bare pass the gradients keep 1 call, from the replay 9."""
    from shardbench.prediction.record_step_time import collectives
    from shardbench.step_figures import BareCompute
    from shardbench.strategies.registry import get_strategy
    from tests.records import make_record

    record = make_record(
        comm_per_step={
            "ops": {"all_reduce": {"calls": 9, "bytes": 4064}, "broadcast": {"calls": 1, "bytes": 8}}
        },
        predicted_comm={"ops": {"all_reduce": {"bytes": 4000}}},
        bare_compute=BareCompute(seconds=0.1, collectives={"all_reduce": {"calls": 8, "bytes": 64}}),
    )

    def calls(uses_bare: bool) -> dict[str, int]:
        found = collectives(record, get_strategy("ddp"), "gloo", None, uses_bare=uses_bare)
        return {f"{c.kind} {c.role}": c.calls for c in found}

    assert calls(True) == {"all_reduce gradients": 1, "broadcast other": 1}
    assert calls(False) == {"all_reduce gradients": 9, "broadcast other": 1}
