"""tests/dist.py itself: results come back, a failing rank is re-raised, a hang is bounded."""

import time

import pytest
import torch
import torch.distributed as dist

from tests.dist import RankFailed, run_distributed


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
