"""How zero1 should reduce its gradients on gloo, measured: DistributedDataParallel's all-reduce
(then the optimizer's all-gather), or our ShardedDataParallel(stage=1) with an in-place all-reduce
or a reduce-scatter to the owners. Also times gloo's two collectives alone on a 25 MB bucket.

Two gloo ranks on this machine, one thread each, the three variants interleaved step by step (so
drift hits them alike), slowest rank's time per step, median and MAD after 3 warm-up steps:

    .venv/bin/python scripts/measure_zero1_gloo.py PRESET STEPS BATCH   # e.g. small 12 4

docs/measuring.md ("zero1 on gloo") has the figures and the choice they led to.
"""

import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from shardbench.models.registry import get_workload
from shardbench.strategies.sharded import ShardedDataParallel, ShardedOptimizer
from tests.dist import run_distributed

VARIANTS = ("ddp", "all_reduce", "reduce_scatter")


def rank_fn(rank, ws, preset, steps, batch):
    torch.set_num_threads(1)
    w = get_workload("transformer")
    out = {}
    # raw collectives: 25 MB bucket
    buf = torch.ones(25 * 2**20 // 4)
    o = torch.empty(buf.numel() // ws)
    for name, fn in (
        ("all_reduce", lambda: dist.all_reduce(buf)),
        ("reduce_scatter", lambda: dist.reduce_scatter_tensor(o, buf)),
    ):
        ts = []
        for _ in range(12):
            dist.barrier()
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        out["raw_" + name] = ts[2:]
    models = {}
    for v in VARIANTS:
        torch.manual_seed(0)
        m = w.build(preset, dropout=False)
        opt = ShardedOptimizer.from_optimizer(w.optimizer_factory()(m))
        wrapped = (
            DistributedDataParallel(m, gradient_as_bucket_view=True, bucket_cap_mb=25)
            if v == "ddp"
            else ShardedDataParallel(m, opt, stage=1, gradient_collective=v)
        )
        models[v] = (wrapped, opt)
        out[v] = []
    for rep in range(steps):
        for v in VARIANTS:  # interleaved: drift hits every variant alike
            wrapped, opt = models[v]
            inputs = w.batch(preset, batch, seed=0, step=rep, rank=rank)
            dist.barrier()
            t = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            w.loss(wrapped, inputs).backward()
            opt.step()
            out[v].append(time.perf_counter() - t)
    for v in VARIANTS:
        if isinstance(models[v][0], ShardedDataParallel):
            models[v][0].close()
    return out


if __name__ == "__main__":
    preset, steps, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    res = run_distributed(rank_fn, 2, preset, steps + 3, batch, timeout_s=1800)
    for k in res[0]:
        ts = [max(a, b) for a, b in zip(res[0][k], res[1][k], strict=True)]
        if not k.startswith("raw"):
            ts = ts[3:]
        med = statistics.median(ts)
        mad = statistics.median(abs(t - med) for t in ts)
        print(f"{k:16s} median {med * 1e3:8.1f} ms  MAD {mad * 1e3:6.1f} ms  n={len(ts)}")
