"""What a step communicates (``bench/metrics/comm.py``): every strategy's collectives are counted
in one tracked step, on the fake process group as on gloo, with the bytes ZeRO's accounting
predicts (fp32, Psi parameters, a ring's (N-1)/N): DDP all-reduces 4 Psi bytes (2 (N-1)/N x that
sent per rank), zero1 adds an all-gather of the parameters, zero2 reduce-scatters and all-gathers
them (all-reduces in place on gloo), zero3 gathers every unit twice but the root, which stays
gathered from forward into backward. The small fixed collectives (buffers' broadcast, zero2's
used-parameter flags) are listed as their own kinds."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

from bench.metrics.comm import CollectiveCounter
from tests.cells import run_cell_here, tiny_cell
from tests.dist import fake_world


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


@functools.cache
def _ops(strategy: str, n: int, *, fake: bool = False, simulate: bool = True) -> tuple[dict, int]:
    r = run_cell_here(tiny_cell(strategy=strategy, world_size=n, simulate=simulate, fake=fake))
    assert r.status == "ok", r.error
    return r.comm_per_step["ops"], 4 * r.params  # fp32 bytes of the parameters


def test_simulated_volumes_follow_zero_accounting() -> None:
    n = 8
    ring = (n - 1) / n
    ddp, psi = _ops("ddp", n)
    assert ddp["all_reduce"]["bytes"] == psi and ddp["all_reduce"]["sent_per_rank"] == round(2 * ring * psi)
    zero1, _ = _ops("zero1", n)
    assert zero1["all_reduce"]["bytes"] == psi and zero1["all_gather"]["bytes"] == pytest.approx(
        psi, rel=0.01
    )
    zero2, _ = _ops("zero2", n)
    assert zero2["reduce_scatter"]["bytes"] == pytest.approx(psi, rel=0.01)  # padded to N chunks
    assert zero2["all_gather"]["bytes"] == zero2["reduce_scatter"]["bytes"]
    assert zero2["all_reduce"]["bytes"] < 0.001 * psi  # the used-parameter flags only
    zero3, _ = _ops("zero3", n)
    assert zero3["reduce_scatter"]["bytes"] == pytest.approx(psi, rel=0.01)
    assert 1.9 * psi < zero3["all_gather"]["bytes"] < 2.0 * psi  # twice, less the root's second


def test_real_gloo_ranks_count_the_same_volumes() -> None:
    ddp, psi = _ops("ddp", 2, simulate=False)
    assert ddp["all_reduce"]["bytes"] == psi and ddp["all_reduce"]["sent_per_rank"] == psi
    zero2, _ = _ops("zero2", 2, simulate=False)  # gloo: each bucket all-reduced in place
    assert zero2["all_reduce"]["bytes"] == pytest.approx(psi, rel=0.01)
    assert zero2["all_gather"]["bytes"] == pytest.approx(psi, rel=0.01)
