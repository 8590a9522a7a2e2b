"""A GEMM probe: the FLOP/s one large square matrix product reaches on this device, at a dtype
and (on a CPU) a thread count. What a device not in the datasheet table is measured against.

The method is fixed: an ``n x n`` by ``n x n`` product (``n`` = 1024 on a CPU, 8192 on a GPU:
large enough that the GEMM library runs at its best blocking), two untimed products first, then
each product timed alone (the device synchronised around it) until ``BUDGET_S`` has passed and
at least ``MIN_REPEATS`` were timed (at most ``MAX_REPEATS``). Each product counts ``2 n^3``
FLOPs. The peak is the best rate of the repeats: what the device reached, since another
process on the cores only ever slows a product down (on a shared 2-core machine the median was
half the best, and would have changed with the load of the minute it was measured in); the
median and the MAD of the rates are kept beside it. Inputs are standard-normal from a seeded
generator. On a 2-core CPU it takes about a third of a second.

A CPU without native kernels for a 16-bit dtype (bf16 or fp16 on a core without AVX-512's
16-bit instructions) runs its products in a reference loop, two orders of magnitude below fp32:
a 1024 product in bf16 took 1.4 s on such a 2-core machine, so the fixed repeats would take
ten seconds. So on a CPU a ``MIN_N`` product is timed first, and ``n`` is halved (down to
``MIN_N``) while a product would take longer than ``BUDGET_S`` at that rate: such a loop's rate
hardly depends on the size, and the record names the ``n`` it was measured at.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

SIZES = {"cpu": 1024, "cuda": 8192}
#: the smallest product a slow dtype's probe shrinks to
MIN_N = 128
BUDGET_S = 0.25
MIN_REPEATS = 5
MAX_REPEATS = 200
WARMUP = 2


def _cpu_size(torch: Any, dtype: Any, n: int) -> int:
    """``n``, halved (down to ``MIN_N``) while a product of that size would take longer than
    ``BUDGET_S`` at the rate a ``MIN_N`` product runs at (the module docstring)."""
    a = torch.ones(MIN_N, MIN_N, dtype=dtype)
    torch.mm(a, a)
    started = time.perf_counter()
    torch.mm(a, a)
    small = time.perf_counter() - started
    while n > MIN_N and small * (n / MIN_N) ** 3 > BUDGET_S:
        n //= 2  # a reference loop, not the GEMM library: a smaller product reads its rate
    return n


def probe(device: str, dtype: str, threads: int | None) -> dict[str, Any]:
    """Measure (see the module docstring): ``flops_per_s`` (the best rate),
    ``median_flops_per_s``, ``mad_flops_per_s``, ``repeats``, ``n`` and ``seconds`` (the timed
    products' total)."""
    import torch

    dtypes = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if dtype not in dtypes:
        raise ValueError(f"unknown matmul dtype {dtype!r}; allowed: {', '.join(dtypes)}")
    if device not in SIZES:
        raise ValueError(f"unknown device {device!r}; allowed: {', '.join(SIZES)}")
    n = SIZES[device]
    target = torch.device(device)
    before_threads = torch.get_num_threads()
    before_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        if device == "cpu" and threads:
            torch.set_num_threads(threads)
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        if device == "cpu":
            n = _cpu_size(torch, dtypes[dtype], n)
        g = torch.Generator(target).manual_seed(0)
        a = torch.randn(n, n, generator=g, device=target).to(dtypes[dtype])
        b = torch.randn(n, n, generator=g, device=target).to(dtypes[dtype])
        out = torch.empty(n, n, device=target, dtype=dtypes[dtype])
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        for _ in range(WARMUP):
            torch.mm(a, b, out=out)
        sync()
        times: list[float] = []
        while len(times) < MAX_REPEATS and (len(times) < MIN_REPEATS or sum(times) < BUDGET_S):
            started = time.perf_counter()
            torch.mm(a, b, out=out)
            sync()
            times.append(time.perf_counter() - started)
    finally:
        torch.set_num_threads(before_threads)
        torch.backends.cuda.matmul.allow_tf32 = before_tf32
    rates = [2 * n**3 / t for t in times]
    median = statistics.median(rates)
    return {
        "flops_per_s": max(rates),
        "median_flops_per_s": median,
        "mad_flops_per_s": statistics.median(abs(r - median) for r in rates),
        "repeats": len(rates),
        "n": n,
        "seconds": sum(times),
    }
