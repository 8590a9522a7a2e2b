"""Reproducer for issue #10: a rank of a 2-rank gloo world dies by SIGABRT ("terminate called
without an active exception") at exit, after training our zero1/zero2.

Each trial forks a fresh pair of ranks (cheap: torch is imported once, here) that each run
``--worlds`` 2-rank gloo worlds, a zero1 (ShardedOptimizer + DDP) and a zero2 (ShardedOptimizer +
ShardedDataParallel) one per world, on tests/tricky.py's model: init_process_group(FileStore),
build, train 3 steps, drop the objects, destroy_process_group. Then the rank exits through normal
interpreter finalization, as a script or a spawned rank does. A rank killed by a signal is an
abort. ``--switch-interval 0.5`` widens the race (a gloo worker thread waiting for the GIL when
the interpreter starts finalizing); ``--torch-zero`` runs torch's ZeroRedundancyOptimizer + DDP
instead, for comparison. Linux only (fork, /proc).

    python scripts/repro_issue10_abort.py --trials 20 --worlds 1 --switch-interval 0.5
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from bench.strategies.sharded import ShardedDataParallel, ShardedOptimizer  # noqa: E402
from tests import tricky  # noqa: E402


def gloo_threads() -> int:
    tasks = "/proc/self/task"
    return sum(open(f"{tasks}/{t}/comm").read().strip() == "pt_gloo_runloop" for t in os.listdir(tasks))


def one_world(rank: int, kind: str) -> None:
    model = tricky.build()
    if kind == "torch-zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        params = [p for p in model.parameters() if p.requires_grad]
        opt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=1e-4)
        wrapped = DistributedDataParallel(model, find_unused_parameters=True)
    else:
        opt = ShardedOptimizer(tricky.param_groups(model), optim=torch.optim.AdamW, bucket_cap_mb=0.0005)
        if kind == "zero2":
            wrapped = ShardedDataParallel(model, opt)
        else:
            wrapped = DistributedDataParallel(
                model, gradient_as_bucket_view=True, find_unused_parameters=True
            )
    tricky.train_sharded_steps(wrapped, opt, range(3), rank, 2)


def rank_main(rank: int, store_dir: str, args: argparse.Namespace, report: bool) -> None:
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    kinds = ("torch-zero", "torch-zero") if args.torch_zero else ("zero1", "zero2")
    for w in range(args.worlds):
        for i, kind in enumerate(kinds):
            store = dist.FileStore(os.path.join(store_dir, f"w{w}-{i}"), 2)
            dist.init_process_group(
                "gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=60)
            )
            one_world(rank, kind)
            dist.destroy_process_group()
    if report:
        print(f"gloo worker threads alive after the last destroy_process_group: {gloo_threads()}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--worlds", type=int, default=1, help="worlds (zero1 + zero2 each) per rank process")
    ap.add_argument("--switch-interval", type=float, default=0.0)
    ap.add_argument("--torch-zero", action="store_true")
    args = ap.parse_args()
    if args.torch_zero:  # imported before init, as a script using it would
        from torch.distributed.optim import ZeroRedundancyOptimizer  # noqa: F401
    torch.set_num_threads(1)
    aborts, failures, start = 0, 0, time.monotonic()
    for trial in range(args.trials):
        store_dir = tempfile.mkdtemp(prefix="repro-issue10-")
        pids = []
        for rank in range(2):
            pid = os.fork()
            if pid == 0:
                try:
                    rank_main(rank, store_dir, args, report=trial == 0 and rank == 0)
                except BaseException:
                    import traceback

                    traceback.print_exc()
                    os._exit(3)
                sys.exit(0)  # finalization at the top level, as at the end of any script
            pids.append(pid)
        codes = []
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            codes.append(-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
        if any(c < 0 for c in codes):
            aborts += 1
            names = [signal.Signals(-c).name for c in codes if c < 0]
            print(f"trial {trial}: exit codes {codes} {names}", flush=True)
        elif any(codes):
            failures += 1
            print(f"trial {trial}: exit codes {codes}", flush=True)
    what = "torch ZeroRedundancyOptimizer" if args.torch_zero else "zero1 + zero2"
    print(
        f"{args.trials} trials x 2 ranks x {args.worlds} worlds ({what}): {aborts} aborted, "
        f"{failures} other failures, {time.monotonic() - start:.0f}s"
    )


if __name__ == "__main__":
    main()
