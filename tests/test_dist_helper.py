"""tests/dist.py itself: results come back, a failing rank is re-raised, a hang is bounded; a
shared world runs check after check and is replaced after a failure."""

import time

import pytest
import torch
import torch.distributed as dist

from tests.dist import RankFailed, World, run_distributed, run_in_world, shared_world


def _sum_ranks(rank: int, world_size: int) -> float:
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return t.item()


def _fail_on_last(rank: int, world_size: int) -> None:
    if rank == world_size - 1:
        raise ValueError("boom from the last rank")
    dist.barrier()


def _hang(rank: int, world_size: int) -> None:
    time.sleep(60)


def test_results_come_back_in_rank_order() -> None:
    assert run_distributed(_sum_ranks, 2) == [1.0, 1.0]


def test_failing_rank_is_reraised_with_its_traceback() -> None:
    with pytest.raises(RankFailed, match="boom from the last rank"):
        run_distributed(_fail_on_last, 2, timeout_s=30)


def test_hang_is_bounded() -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        run_distributed(_hang, 2, timeout_s=3)
    assert time.monotonic() - start < 20


def test_shared_world_runs_check_after_check_and_ends_on_a_failure() -> None:
    world = shared_world(2)
    assert run_in_world(_sum_ranks, 2) == [1.0, 1.0] == run_in_world(_sum_ranks, 2)
    assert shared_world(2) is world  # the same ranks ran both
    doomed = World(2)
    assert doomed.run(_sum_ranks) == [1.0, 1.0]
    with pytest.raises(RankFailed, match="boom from the last rank"):
        doomed.run(_fail_on_last, timeout_s=30)
    assert not doomed.alive  # killed: its other rank was blocked in a barrier
    with pytest.raises(RankFailed, match="closed after an earlier failure"):
        doomed.run(_sum_ranks)
