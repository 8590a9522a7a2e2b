"""What a step communicates (``bench/metrics/comm.py``) against ZeRO's accounting
(``bench/metrics/analytic.predicted_comm``): every strategy's collectives are counted in one
tracked step, on the fake process group as on gloo, and equal the prediction for its precision
and backend within 1% in all and per kind: DDP all-reduces 4 Psi bytes (2 (N-1)/N x that sent per
rank), zero1 adds an all-gather of the parameters, zero2 reduce-scatters and all-gathers them
(all-reduces in place on gloo), zero3 gathers every unit twice but the root, which stays gathered
from forward into backward, torch-zero1 broadcasts, FSDP2 pads each parameter's dim 0 to N. The
small fixed collectives (buffers' broadcast, our used-parameter flags) are what the prediction
leaves out: their own kinds, under 1% of the volume."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist

from shardbench.harness.config import CellConfig
from shardbench.metrics.analytic import CommShape, Communication, predicted_comm
from shardbench.metrics.comm import CollectiveCounter
from tests.cells import run_cell_here, tiny_cell
from tests.dist import fake_world, run_in_world

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "torch-zero1", "fsdp2-zero2", "fsdp2-zero3")


def test_counter_sees_each_kind_with_ring_bytes() -> None:
    with fake_world(4), CollectiveCounter(4) as counter:
        x = torch.ones(8)
        dist.all_reduce(x)
        dist.all_gather_into_tensor(torch.empty(32), x)
        dist.reduce_scatter_tensor(torch.empty(2), x)
        dist.broadcast(x, 0)
    ops = counter.summary()["ops"]
    assert ops["all_reduce"] == {"calls": 1, "bytes": 32, "sent_per_rank": 48}  # 2 (N-1)/N
    assert ops["all_gather"] == {"calls": 1, "bytes": 128, "sent_per_rank": 96}  # the full output
    assert ops["reduce_scatter"] == {"calls": 1, "bytes": 32, "sent_per_rank": 24}  # the full input
    assert ops["broadcast"] == {"calls": 1, "bytes": 32, "sent_per_rank": 24}
    assert counter.summary()["sent_per_rank"] == 192


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_measured_volume_equals_zero_accounting(strategy: str) -> None:
    """On real gloo ranks in fp32 at N = 2, and at N = 4 for zero2 and zero3, whose reducer's
    gloo path changes there (each chunk reduced to its owner; zero1 reduces with DDP at every N);
    in the fake group at 64 in (fake) bf16, so a size per element or a share per rank counted
    wrong at scale shows too. A peer's or DDP's collectives are the same calls at any N, so their
    larger worlds are counted where they cost no process."""
    real = (2, 4) if strategy in ("zero2", "zero3") else (2,)
    cells = [tiny_cell(strategy=strategy, world_size=n, steps=1) for n in real]
    cells.append(tiny_cell(strategy=strategy, world_size=64, fake=True, simulate=True, precision="bf16"))
    for cell in cells:
        _assert_measured_equals_predicted(cell)


def _assert_measured_equals_predicted(cell) -> dict:
    r = run_cell_here(cell)
    assert r.status == "ok", r.error
    measured, predicted = r.comm_per_step, r.predicted_comm
    where = f"{cell.strategy} {cell.workload} N={cell.world_size} {r.backend} {cell.precision}"
    assert measured["sent_per_rank"] == pytest.approx(predicted["sent_per_rank"], rel=0.01), where
    for kind, want in predicted["ops"].items():
        assert measured["ops"][kind]["bytes"] == pytest.approx(want["bytes"], rel=0.01), (where, kind)
    fixed = sum(v["bytes"] for k, v in measured["ops"].items() if k not in predicted["ops"])
    assert fixed < 0.01 * sum(v["bytes"] for v in predicted["ops"].values()), where
    return measured


#: the frozen stem, in bytes (fp32): sent only where parameters are sharded
FROZEN_BYTES = 4 * (64 * 64 + 64)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_frozen_parameters_are_gathered_where_parameters_are_sharded(strategy: str) -> None:
    """A frozen layer is never reduced; zero3 and FSDP2 shard it and gather it with its unit
    (ours keeps the root, where the stem is, gathered from forward into backward: once a step;
    FSDP2 gathers it again for backward, and fsdp2-zero2 once), the others keep it whole and
    send none of it. Measured equals predicted, on gloo ranks and in the fake group."""
    cells = [
        CellConfig(
            workload="tests.user_models:frozen_net",
            preset="default",
            strategy=strategy,
            world_size=n,
            batch_size=2,
            steps=1,
            warmup=1,
            simulate=fake,
            fake=fake,
        )  # fmt: skip
        for n, fake in ((2, False), (8, True))
    ]
    for cell in cells:
        measured = _assert_measured_equals_predicted(cell)
    gathered = measured["ops"].get("all_gather", {"bytes": 0})["bytes"]
    trainable = 4 * (2 * (64 * 64 + 64) + 64 * 4 + 4)
    padding = 4 * (4 * 64 + 4)  # the head's dim 0 (4) padded to N = 8: FSDP2 only
    expected = {
        "zero1": trainable, "zero2": trainable, "zero3": 2 * trainable - 4 * 260 + FROZEN_BYTES,
        "fsdp2-zero2": trainable + padding + FROZEN_BYTES,
        "fsdp2-zero3": 2 * (trainable + padding + FROZEN_BYTES),
    }.get(strategy, 0)  # fmt: skip
    assert gathered == pytest.approx(expected, rel=0.01), (strategy, gathered)


def test_prediction_pads_dim0_and_keeps_the_root() -> None:
    shape = CommShape(dims=((768, 768 * 768), (3, 3 * 10)), root_elements=30)
    fsdp = Communication(
        gradients="reduce_scatter", gradient_bytes=4, parameters="all_gather", parameter_bytes=2,
        gathers=2, dim0_padding=True,
    )  # fmt: skip
    padded = 1024 * 768 + 1024 * 10  # each dim 0 to a multiple of N
    got = predicted_comm(fsdp, shape, 1024)["ops"]
    assert got["reduce_scatter"]["bytes"] == 4 * padded and got["all_gather"]["bytes"] == 2 * 2 * padded
    ours = Communication(
        gradients="all_reduce", gradient_bytes=4, parameters="all_gather", parameter_bytes=4,
        gathers=2, root_kept=True,
    )  # fmt: skip
    out = predicted_comm(ours, shape, 4)
    elements = 768 * 768 + 30
    assert out["ops"]["all_gather"]["bytes"] == 4 * (2 * elements - 30)
    assert out["ops"]["all_reduce"]["sent_per_rank"] == round(4 * elements * 2 * 3 / 4)
    assert out["sent_per_rank"] == sum(v["sent_per_rank"] for v in out["ops"].values())


def test_prediction_gathers_frozen_parameters_only_where_they_are_sharded() -> None:
    """Frozen elements are never reduced; a strategy that shards them gathers them at each of
    its gathers (padded on dim 0 where it pads), the root's kept ones once."""
    shape = CommShape(dims=((4, 40),), root_elements=8, frozen=((3, 30), (2, 2)), root_frozen_elements=30)
    ours = Communication(
        gradients="reduce_scatter", gradient_bytes=4, parameters="all_gather", parameter_bytes=4,
        gathers=2, root_kept=True, frozen_gathered=True,
    )  # fmt: skip
    got = predicted_comm(ours, shape, 4)["ops"]
    assert got["reduce_scatter"]["bytes"] == 4 * 40
    assert got["all_gather"]["bytes"] == 4 * (2 * (40 + 32) - (8 + 30))
    fsdp = Communication(
        gradients="reduce_scatter", gradient_bytes=4, parameters="all_gather", parameter_bytes=2,
        gathers=2, dim0_padding=True, frozen_gathered=True,
    )  # fmt: skip
    assert predicted_comm(fsdp, shape, 4)["ops"]["all_gather"]["bytes"] == 2 * 2 * (40 + 40 + 4)
    whole = Communication(
        gradients="reduce_scatter", gradient_bytes=4, parameters="all_gather", parameter_bytes=4
    )
    assert predicted_comm(whole, shape, 4)["ops"]["all_gather"]["bytes"] == 4 * 40


def _zero2_steps(rank: int, world_size: int, count: bool) -> tuple[dict | None, dict | None, dict]:
    """Three zero2 steps of the tiny transformer, the last with its collectives counted (and the
    counting itself watched by an outer counter) when ``count``; then the parameters."""
    from shardbench.models.registry import get_workload
    from shardbench.strategies.base import RankContext
    from shardbench.strategies.registry import get_strategy

    torch.manual_seed(0)
    workload, strategy = get_workload("transformer"), get_strategy("zero2")
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device("cpu"))
    model, opt = strategy.setup(workload.build("tiny", dropout=False), workload.optimizer_factory(), ctx)
    outer, inner = CollectiveCounter(world_size), CollectiveCounter(world_size)
    for step in range(3):
        batch = workload.batch("tiny", 2, seed=0, step=step, rank=rank)
        with contextlib.ExitStack() as counting:
            if count and step == 2:
                counting.enter_context(outer)
                counting.enter_context(inner)
            strategy.train_step(model, opt, batch, workload.loss)
    state = {k: v.detach().clone() for k, v in strategy.model.module.state_dict().items()}
    strategy.teardown()
    return (outer.summary(), inner.summary(), state) if count else (None, None, state)


def test_counting_adds_no_collectives_and_keeps_parity() -> None:
    """An outer counter around the inner one sees exactly the step's collectives (counting issues
    none of its own), and the parameters after counted steps equal those after plain ones,
    bit for bit, on real gloo ranks."""
    counted = run_in_world(_zero2_steps, 2, True)
    plain = run_in_world(_zero2_steps, 2, False)
    for (outer, inner, state), (_, _, reference) in zip(counted, plain, strict=True):
        assert outer == inner and inner["ops"]
        assert state.keys() == reference.keys()
        assert all(torch.equal(state[k], reference[k]) for k in state)


@pytest.mark.parametrize("world_size", [8, 1024])
def test_zero1_sends_what_ddp_sends(world_size: int) -> None:
    """ZeRO's P_os: gradients reduce-scattered to their owners and parameters all-gathered is one
    all-reduce's volume, so zero1 sends DDP's bytes per rank per step (fake group), where an
    all-reduce followed by the all-gather sent 1.5x."""
    sent = {}
    for strategy in ("ddp", "zero1"):
        r = run_cell_here(tiny_cell(strategy=strategy, world_size=world_size, fake=True, simulate=True))
        assert r.status == "ok", r.error
        sent[strategy] = r.comm_per_step["sent_per_rank"]
    assert sent["zero1"] == pytest.approx(sent["ddp"], rel=0.01), sent
