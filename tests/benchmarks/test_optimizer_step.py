"""One ``ShardedOptimizer`` step over 128 buckets on one rank.

The step walks the buckets one by one (update this rank's pieces, then launch the bucket's
gather), so its fixed cost per bucket is what grows with the model's bucket count; small
tensors keep the arithmetic cheap on a CPU and leave that per-bucket path in view. One rank of a
fake world: no collective runs, the rank owns every element, so the result can be checked
exactly against plain AdamW.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from shardbench.strategies.sharded import ShardedOptimizer
from tests.dist import fake_world

N_PARAMS, SHAPE = 256, (64, 32)
PER_BUCKET = 2
CAP_MB = PER_BUCKET * SHAPE[0] * SHAPE[1] * 4 / 2**20


@pytest.mark.benchmark(group="sharded", min_rounds=20)  # ~0.1 s a step: a steadier median
def test_sharded_optimizer_step_over_many_buckets(benchmark) -> None:
    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(SHAPE)) for _ in range(N_PARAMS)]
    grads = [torch.randn(SHAPE) for _ in range(N_PARAMS)]
    reference = [nn.Parameter(p.detach().clone()) for p in params]
    with fake_world(1):
        opt = ShardedOptimizer(params, optim=torch.optim.AdamW, lr=1e-2, bucket_cap_mb=CAP_MB)
        assert len(opt.buckets) == N_PARAMS // PER_BUCKET
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        benchmark(opt.step)
        steps = {int(st["step"]) for st in opt.state.values()}
    assert len(steps) == 1 and len(opt.state) == N_PARAMS  # every piece of every bucket, each call
    plain = torch.optim.AdamW(reference, lr=1e-2)
    for p, g in zip(reference, grads, strict=True):
        p.grad = g.clone()
    for _ in range(steps.pop()):
        plain.step()
    for p, ref in zip(params, reference, strict=True):
        torch.testing.assert_close(p.detach(), ref.detach())
