"""A rank of a gloo world that trained our ZeRO stages must exit cleanly. A gloo group that
``destroy_process_group`` cannot free (something still holds it) lives on into interpreter
shutdown, where its worker threads may still take the GIL to release a finished collective's
tensors, and are killed doing so: SIGABRT, "terminate called without an active exception".

One spawned pair of ranks runs 10 zero1 and 10 zero2 worlds, each from scratch: init, build,
train 3 steps, drop the model and optimizer (no explicit close: a training script may not call
one), destroy. After every destroy no gloo worker thread may survive: that count is
deterministic (the group was freed or it was not), so a few worlds find a group left behind as
surely as many; and each rank must exit cleanly at the end (no abort at shutdown).
"""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from shardbench.strategies.sharded import ShardedDataParallel, ShardedOptimizer
from tests import tricky
from tests.dist import run_distributed

WORLDS, STEPS = 10, 3


TASKS = "/proc/self/task"


def _gloo_threads() -> int:
    """Live gloo worker threads in this process (Linux's /proc names each thread)."""
    names = []
    for tid in os.listdir(TASKS):
        try:
            with open(os.path.join(TASKS, tid, "comm")) as f:
                names.append(f.read().strip())
        except OSError:  # the thread exited meanwhile
            pass
    return names.count("pt_gloo_runloop")


def _one_world(rank: int, world_size: int, stage: int) -> None:
    """zero1 or zero2 as the parity tests build them (not imported from there: the ranks start
    faster without the workload registry those tests import)."""
    model = tricky.build()
    opt = ShardedOptimizer(tricky.param_groups(model), optim=torch.optim.AdamW, bucket_cap_mb=0.0005)
    if stage == 2:
        wrapped = ShardedDataParallel(model, opt)
    else:
        wrapped = DistributedDataParallel(model, gradient_as_bucket_view=True, find_unused_parameters=True)
    tricky.train_sharded_steps(wrapped, opt, range(STEPS), rank, world_size)


def _worlds(rank: int, world_size: int, store_dir: str) -> dict[int, list[int]]:
    """Per stage, the gloo threads left after each world's ``destroy_process_group``."""
    # The harness's group: every world below makes its own. The barrier first, or a rank could
    # close its connections while the other is still connecting.
    dist.barrier()
    dist.destroy_process_group()
    left: dict[int, list[int]] = {1: [], 2: []}
    for w in range(WORLDS):
        for stage in (1, 2):
            store = dist.FileStore(os.path.join(store_dir, f"w{w}-s{stage}"), world_size)
            dist.init_process_group(
                "gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
            )
            _one_world(rank, world_size, stage)
            dist.destroy_process_group()
            left[stage].append(_gloo_threads())
    return left


@pytest.mark.skipif(not os.path.isdir(TASKS), reason="counting gloo's threads needs Linux's /proc/self/task")
def test_every_world_per_stage_leaves_no_group_behind(tmp_path) -> None:
    ranks = run_distributed(_worlds, 2, str(tmp_path), timeout_s=90, check_exit=True)
    for rank, left in enumerate(ranks):
        for stage, threads in left.items():
            assert len(threads) == WORLDS and all(t == 0 for t in threads), (
                f"rank {rank} zero{stage}: gloo threads alive after each destroy_process_group: {threads}"
            )
