"""A rank of a gloo world that trained our ZeRO must exit cleanly. A gloo group that
``destroy_process_group`` cannot free (something still holds it) lives on into interpreter
shutdown. There its worker thread may still need the GIL after the last collective, and is
killed taking it: SIGABRT, "terminate called without an active exception"
(``scripts/exit_abort_mechanism.py`` shows this with plain torch). So our ZeRO must never hold
a group.

One spawned pair of ranks runs, per stage (1, 2, 3, and stage 2 hybrid with S = 1), worlds
from scratch: init, build, train 3 steps, destroy. In most worlds the model and optimizer are
dropped before the destroy, as a training function's locals are. In the last one they are
still alive during the destroy, as a script's globals are. After every destroy no gloo worker
thread may survive. That count is deterministic (the group was freed or it was not), so a few
worlds find a group left behind as surely as many. Each rank must also exit cleanly at the end.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch import nn

from shardbench.strategies.sharded import ShardedDataParallel, ShardedOptimizer
from tests import tricky
from tests.dist import run_distributed

WORLDS, STEPS = 2, 3
KINDS = ("zero1", "zero2", "zero3", "zero2 S=1")


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


def _one_world(rank: int, world_size: int, kind: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    """One kind as the parity tests build it (not imported from there: the ranks start faster
    without the workload registry those tests import), trained; its model and optimizer."""
    model = tricky.build()
    opt = ShardedOptimizer(tricky.param_groups(model), optim=torch.optim.AdamW, bucket_cap_mb=0.0005)
    if kind == "zero3":
        wrapped = ShardedDataParallel(model, opt, stage=3, unit=tricky.child_units(model))
    else:
        width = 1 if kind.endswith("S=1") else None
        wrapped = ShardedDataParallel(model, opt, stage=int(kind[4]), shard_group_size=width)
    tricky.train_sharded_steps(wrapped, opt, range(STEPS), rank, world_size)
    return wrapped, opt


def _worlds(rank: int, world_size: int, store_dir: str) -> dict[str, list[int]]:
    """Per kind, the gloo threads left after each world's ``destroy_process_group``."""
    # The harness's group: every world below makes its own. The barrier first, or a rank could
    # close its connections while the other is still connecting.
    dist.barrier()
    dist.destroy_process_group()
    left: dict[str, list[int]] = {kind: [] for kind in KINDS}
    for w in range(WORLDS):
        for k, kind in enumerate(KINDS):
            store = dist.FileStore(os.path.join(store_dir, f"w{w}-k{k}"), world_size)
            dist.init_process_group(
                "gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
            )
            alive = _one_world(rank, world_size, kind)
            if w < WORLDS - 1:
                del alive  # a training function's locals, gone before its caller destroys
            dist.destroy_process_group()
            left[kind].append(_gloo_threads())
            alive = None
    return left


@pytest.mark.skipif(not os.path.isdir(TASKS), reason="counting gloo's threads needs Linux's /proc/self/task")
def test_every_world_per_stage_leaves_no_group_behind(tmp_path) -> None:
    ranks = run_distributed(_worlds, 2, str(tmp_path), timeout_s=90, check_exit=True)
    for rank, left in enumerate(ranks):
        assert list(left) == list(KINDS)
        for stage, threads in left.items():
            assert len(threads) == WORLDS and all(t == 0 for t in threads), (
                f"rank {rank} {stage}: gloo threads alive after each destroy_process_group "
                f"(the last with the model and optimizer still alive): {threads}"
            )
