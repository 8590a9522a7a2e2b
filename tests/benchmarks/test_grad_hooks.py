"""One backward through ``ShardedDataParallel``'s per-parameter gradient hooks: 1024 small
parameters (biases and 16x16 weights), in the default buckets.

Each parameter's post-accumulate hook copies its gradient into the bucket buffer, frees
``param.grad`` and launches the bucket when it is complete; with many small parameters that
per-parameter bookkeeping, not the arithmetic, is the cost (compare a plain backward of the same
model: ``test_plain_backward``). Only the backward is timed (the
forward is the round's setup). One rank of a fake world: the reduced gradient shards equal the
plain model's gradients exactly, which is what is checked.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from shardbench.strategies.sharded import ShardedDataParallel, ShardedOptimizer
from tests.dist import fake_world

LAYERS, WIDTH = 512, 16


@pytest.mark.benchmark(group="sharded")
def test_gradient_hooks_one_backward(benchmark) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    plain = copy.deepcopy(model)
    x = torch.randn(4, WIDTH)
    with fake_world(1):
        opt = ShardedOptimizer(model.parameters(), optim=torch.optim.AdamW)
        sdp = ShardedDataParallel(model, opt)

        def forward() -> tuple[tuple[torch.Tensor], dict]:
            opt.zero_grad(set_to_none=True)
            return (sdp(x).square().mean(),), {}

        try:
            benchmark.pedantic(torch.Tensor.backward, setup=forward, rounds=50, warmup_rounds=2)
            assert all(p.grad is None for p in model.parameters())  # no full gradient survives backward
            shards = sdp.memory_tensors()["grads"]  # world size 1: each bucket's shard is all of it
        finally:
            sdp.close()
    plain(x).square().mean().backward()
    expected = {id(p): q.grad for p, q in zip(model.parameters(), plain.parameters(), strict=True)}
    assert len(shards) == len(opt.buckets)
    for b, shard in zip(opt.buckets, shards, strict=True):
        for p, off in zip(b.params, b.offsets, strict=True):
            torch.testing.assert_close(shard[off : off + p.numel()], expected[id(p)].reshape(-1))


@pytest.mark.benchmark(group="sharded")
def test_plain_backward(benchmark) -> None:
    """The same model's backward without any hook: what the gradient path adds is the difference."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    x = torch.randn(4, WIDTH)

    def forward() -> tuple[tuple[torch.Tensor], dict]:
        model.zero_grad(set_to_none=True)
        return (model(x).square().mean(),), {}

    benchmark.pedantic(torch.Tensor.backward, setup=forward, rounds=50, warmup_rounds=2)
    assert all(p.grad is not None for p in model.parameters())
