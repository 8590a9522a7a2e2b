"""An update probe: the seconds one AdamW step takes per parameter element on this CPU, at a
thread count; the step-time model's optimizer term (``bench/metrics/step_time.py``).

The optimizer step is not counted in a step's FLOPs (``flops.py``) and is memory-bound: AdamW
reads a parameter, its gradient and two moments and writes three of them back, so its time
grows with the elements a rank updates (all of them under ddp, its 1/N share under ZeRO), not
with FLOPs. The method is fixed: ``torch.optim.AdamW`` with the implementation the harness pins
for the CPU (``kernels.pin_implementation``) over ``TENSORS`` fp32 tensors of ``ELEMENTS``
elements in all (large enough to stream from memory, not cache), gradients of ones; one untimed
step, then ``REPEATS`` timed; the median over the elements is the figure. About a tenth of a
second on a 2-core CPU.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

ELEMENTS = 1 << 22
TENSORS = 8
REPEATS = 3


def probe(threads: int) -> dict[str, Any]:
    """Measure: ``seconds_per_element`` (the median), ``mad_seconds_per_element``, ``elements``,
    ``repeats``, ``threads``."""
    import torch

    from shardbench.metrics.kernels import pin_implementation

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        params = [torch.nn.Parameter(torch.zeros(ELEMENTS // TENSORS)) for _ in range(TENSORS)]
        for p in params:
            p.grad = torch.ones_like(p)
        optimizer = pin_implementation(torch.optim.AdamW(params, lr=1e-3), "cpu")
        optimizer.step()
        times = []
        for _ in range(REPEATS):
            started = time.perf_counter()
            optimizer.step()
            times.append(time.perf_counter() - started)
    finally:
        torch.set_num_threads(before)
    per = [t / ELEMENTS for t in times]
    median = statistics.median(per)
    return {
        "seconds_per_element": median,
        "mad_seconds_per_element": statistics.median(abs(p - median) for p in per),
        "elements": ELEMENTS,
        "repeats": REPEATS,
        "threads": threads,
    }
