"""Stress our ZeRO's exit: many short trainings, each in fresh rank processes that exit normally.

Each training starts N gloo ranks (real interpreters, so each one's shutdown runs: an abort at
exit shows as exit status 134 / SIGABRT), trains a small tricky model (tied head, frozen layer,
a branch unused on odd steps, two param groups) for a few steps under stage 1, 2 or 3 with
random delays injected into gradient hooks and around the optimizer step, then calls
``destroy_process_group()`` itself, as a user's script does, and returns. Busy loops run
beside it to vary the timing. At the end it prints how many trainings aborted, hung or left a
process behind, and exits 1 if any did.

    .venv/bin/python scripts/stress_sharded.py                 # 300 trainings, stages 1-3, N = 2, 3, 4
    .venv/bin/python scripts/stress_sharded.py --trainings 30 --stages 2 --world-sizes 3,4

Not part of the test suite: 300 trainings take tens of minutes on two cores.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import time

RANK_PROGRAM = r"""
import os, random, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from shardbench import ShardedDataParallel, ShardedOptimizer

rank, world, stage, seed = (int(a) for a in sys.argv[1:5])
store = sys.argv[5]
delays = random.Random(seed * 1009 + rank)
torch.set_num_threads(1)

def nap(limit_s=0.004):
    time.sleep(delays.random() * limit_s)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(97, 16)
        self.frozen = nn.Linear(16, 16)
        self.frozen.requires_grad_(False)
        self.body = nn.Linear(16, 16)
        self.branch = nn.Linear(16, 16)
        self.head = nn.Linear(16, 97)
        self.head.weight = self.embed.weight

    def forward(self, tokens, use_branch):
        x = self.embed(tokens).mean(dim=1)
        x = torch.tanh(self.body(self.frozen(x)))
        if use_branch:
            x = x + torch.tanh(self.branch(x))
        return self.head(x)

dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                        timeout=timedelta(seconds=60))
torch.manual_seed(0)
model = Net()
for p in model.parameters():
    if p.requires_grad:
        p.register_post_accumulate_grad_hook(lambda p: nap())
trainable = [p for p in model.parameters() if p.requires_grad]
groups = [{"params": [p for p in trainable if p.dim() >= 2]},
          {"params": [p for p in trainable if p.dim() < 2], "lr": 2e-4}]
opt = ShardedOptimizer(groups, optim=torch.optim.AdamW, lr=1e-4, bucket_cap_mb=0.0005)
if stage == 1:
    wrapped = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True,
                                                  find_unused_parameters=True)
else:
    wrapped = ShardedDataParallel(model, opt, stage=stage)
data = torch.Generator().manual_seed(seed)
for step in range(4):
    opt.zero_grad(set_to_none=True)
    tokens = torch.randint(0, 97, (4, 5), generator=data)
    labels = torch.randint(0, 97, (4,), generator=data)
    F.cross_entropy(wrapped(tokens, step % 2 == 0), labels).backward()
    nap()
    opt.step()
    nap()
dist.barrier()
dist.destroy_process_group()
"""


def _busy(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        sum(i * i for i in range(10_000))


def _children_left(pids: list[int]) -> list[int]:
    return [pid for pid in pids if os.path.exists(f"/proc/{pid}") and _alive(pid)]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def one_training(stage: int, world: int, seed: int, timeout_s: float) -> tuple[str, list[int]]:
    """Run one training; its outcome ("ok", "abort", "crash", "hang") and the ranks' exit codes."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", RANK_PROGRAM, str(r), str(world), str(stage), str(seed), store],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            for r in range(world)
        ]
        deadline = time.monotonic() + timeout_s
        codes: list[int] = []
        hung = False
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung = True
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            codes.append(p.returncode)
        errors = [p.stderr.read().decode(errors="replace") if p.stderr else "" for p in procs]
        for p in procs:
            if p.stderr:
                p.stderr.close()
        left = _children_left([p.pid for p in procs])
        if hung:
            return "hang", codes
        if left:
            return "left", codes
        if any(c in (134, -6) for c in codes):
            return "abort", codes
        if any(c != 0 for c in codes):
            sys.stderr.write(next(e for e, c in zip(errors, codes, strict=True) if c != 0)[-2000:])
            return "crash", codes
        return "ok", codes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trainings", type=int, default=300)
    ap.add_argument("--stages", default="1,2,3")
    ap.add_argument("--world-sizes", default="2,3,4")
    ap.add_argument("--busy", type=int, default=2, help="busy loops running beside the trainings")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds before a training counts as hung")
    args = ap.parse_args()
    stages = [int(s) for s in args.stages.split(",")]
    worlds = [int(n) for n in args.world_sizes.split(",")]
    cells = itertools.cycle(list(itertools.product(stages, worlds)))
    busy = [
        multiprocessing.Process(target=_busy, args=(time.monotonic() + 24 * 3600,), daemon=True)
        for _ in range(args.busy)
    ]
    for b in busy:
        b.start()
    counts: dict[str, int] = {}
    by_cell: dict[tuple[int, int], dict[str, int]] = {}
    start = time.monotonic()
    try:
        for i in range(args.trainings):
            stage, world = next(cells)
            seed = random.randrange(1 << 30)
            outcome, codes = one_training(stage, world, seed=seed, timeout_s=args.timeout)
            counts[outcome] = counts.get(outcome, 0) + 1
            cell = by_cell.setdefault((stage, world), {})
            cell[outcome] = cell.get(outcome, 0) + 1
            if outcome != "ok":
                print(f"training {i + 1}: zero{stage} N={world}: {outcome}, exit codes {codes}", flush=True)
            elif (i + 1) % 25 == 0:
                print(f"{i + 1} trainings, {time.monotonic() - start:.0f} s: {counts}", flush=True)
    finally:
        for b in busy:
            b.terminate()
            b.join()
    print(f"{args.trainings} trainings in {time.monotonic() - start:.0f} s: {counts}")
    for (stage, world), cell in sorted(by_cell.items()):
        print(f"  zero{stage} N={world}: {cell}")
    bad = sum(v for k, v in counts.items() if k != "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
