"""Step timing: synchronized wall-clock per step, reduced to robust statistics.

Why median and MAD: step times on shared machines have heavy tails (a GC pause, a noisy
neighbour); the median and the median absolute deviation describe the typical step and its
spread without letting one outlier move the result. A cell's step time is the *slowest rank's*
per step, because a synchronous data-parallel step finishes when its slowest rank does.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch


def synchronize(device: torch.device) -> None:
    """Wait for queued device work so a timer measures the work, not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    """Run ``fn`` between two synchronisations; return its result and seconds taken."""
    synchronize(device)
    start = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - start


def slowest_rank(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Per step, the maximum over ranks (all ranks must have timed the same number of steps)."""
    if not per_rank:
        return []
    lengths = {len(t) for t in per_rank}
    assert len(lengths) == 1, f"ranks timed different step counts: {lengths}"
    return [max(step) for step in zip(*per_rank, strict=True)]


def slowest_phases(per_rank: Sequence[Sequence[dict[str, float]]]) -> dict[str, float] | None:
    """Per phase (forward, backward, optimizer), the median over its timed steps on the rank
    slowest in it: the terms a step's prediction is checked against (None: no phase timed)."""
    medians: dict[str, float] = {}
    for steps in per_rank:
        for phase in {p for step in steps for p in step}:
            median = statistics.median(step[phase] for step in steps if phase in step)
            medians[phase] = max(medians.get(phase, 0.0), median)
    return medians or None


def _quantile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default method) of sorted data."""
    pos = q * (len(sorted_xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summarize(step_times: Sequence[float]) -> dict[str, float] | None:
    """median, MAD, p10, p90 of step times in seconds; None when nothing was timed."""
    if not step_times:
        return None
    xs = sorted(step_times)
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    return {"median": med, "mad": mad, "p10": _quantile(xs, 0.10), "p90": _quantile(xs, 0.90), "n": len(xs)}
