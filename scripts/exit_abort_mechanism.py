"""Show what makes a gloo rank abort at exit ("terminate called without an active exception",
exit status 134) after ``destroy_process_group()`` returned, with plain torch and no shardbench.

Each trial starts two gloo ranks that run one all-reduce just before they exit. The main thread
then keeps the GIL until shutdown (a long ``sys.setswitchinterval``), which makes a narrow race
certain. The variants differ in one thing each:

- ``held``: the user's script keeps ``dist.group.WORLD`` in a global, so ``destroy_process_group``
  cannot free the group and its worker threads live on into interpreter shutdown;
- ``freed``: nothing holds the group, so ``destroy_process_group`` frees it and joins its threads;
- ``no-destroy``: the script never calls ``destroy_process_group`` (torch's known case);
- ``held-kept``: as ``held``, but the collective's tensor is also kept in a global, so that the
  worker thread does not drop the last reference to it.

The aborts need the group to outlive ``destroy_process_group``. Holding the collective's tensor
does not prevent them. So the rule our ZeRO follows is that it never holds a process group
(``bench/strategies/sharded/groups.py``); ``tests/test_exit_clean.py`` checks it.

    .venv/bin/python scripts/exit_abort_mechanism.py --trials 6

Not part of the test suite: each trial starts two interpreters.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile

RANK_PROGRAM = r"""
import os, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist

rank, variant, store = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2,
                        timeout=timedelta(seconds=30))
if variant.startswith("held"):
    HELD = dist.group.WORLD
if rank == 0:
    time.sleep(0.5)  # rank 1 is already waiting: rank 0's all-reduce completes at once
sys.setswitchinterval(100.0)  # the main thread keeps the GIL from here on
t = torch.ones(4)
dist.all_reduce(t)
if variant == "held-kept":
    KEPT = t
del t
if variant != "no-destroy":
    dist.destroy_process_group()
"""

VARIANTS = ("held", "freed", "no-destroy", "held-kept")


def trial(variant: str) -> list[int]:
    """Both ranks' exit statuses for one trial of ``variant``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", RANK_PROGRAM, str(rank), variant, store],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for rank in range(2)
        ]
        return [p.wait(timeout=120) for p in procs]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=6, help="trials per variant (default 6)")
    args = parser.parse_args()
    print(f"host {socket.gethostname()}, {args.trials} trials per variant, 2 gloo ranks each")
    for variant in VARIANTS:
        codes = [trial(variant) for _ in range(args.trials)]
        aborted = sum(any(c == -6 or c == 134 for c in pair) for pair in codes)
        print(f"  {variant:<11} trials with an abort: {aborted} of {args.trials}   exit statuses: {codes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
