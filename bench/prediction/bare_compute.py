"""A rank's compute, timed on the model itself: its forward and backward on the rank's own batch,
before any strategy wraps it, on every rank of the cell at once; the step-time model's compute
term wherever it was taken (``record_step_time``).

Why time the model rather than only replay its operators (``op_replay``): on a CPU a small
step's time is mostly what no operator list shows. The Python of each module's ``forward``, the
autograd engine that runs backward in C++ between the kernels, and the allocator that finds fresh
memory for each activation cost more per operator than the kernels of a tiny model, and in
opposite directions to a replay that calls each operator from Python: it pays Python's call on
backward's operators, which the engine makes without it, and none of the modules' Python. So the
compute of a model that runs here is taken as the profiling simulators take it: the model's own
pass on the device, timed. What stays for the model to predict is what distinguishes the
strategies: the update of the optimizer state a rank holds, and the communication.

How: after one untimed pass (the allocator's and the kernels' first-call set-up), timed passes
of ``loss(model, inputs)`` and its backward, as many as ``BUDGET_S`` holds (``REPEATS`` bounds
them), the ranks together: each pass's time is its slowest rank's, as a synchronised step's
compute is, and the median of those is the figure.

The passes run on a copy of the model (``copy.deepcopy``) under a forked RNG: whatever a forward
changes (batch normalisation's running statistics, a parameter renormalised in place, a model's
own count of its iterations, which may decide what trains) changes in the copy, so the model and
the RNG are as they were and every rank starts the real steps from the same state. The copy costs
the model's bytes once more while the passes run (``fits`` says when it may). The ranks start the
passes together (after a barrier), so each is timed beside the others, sharing the cores and
memory bandwidth as their steps do.
"""

from __future__ import annotations

import contextlib
import copy
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

#: timed passes after the untimed first one: as many as fit in ``BUDGET_S`` by the first pass's
#: time, within these bounds (a small model's pass is a few milliseconds, and a few passes of it
#: would sample only a moment of a busy machine's drift)
REPEATS = (3, 10)
BUDGET_S = 0.3


def time_forward_backward(
    model: torch.nn.Module,
    loss: Callable[[torch.nn.Module, Any], torch.Tensor],
    inputs: Any,
    *,
    device: torch.device,
    autocast: torch.dtype | None = None,
    agree: Callable[[float], float] = float,
    most: int = REPEATS[1],
    world_size: int | None = None,
) -> dict[str, Any] | None:
    """The model's forward and backward on ``inputs``: ``seconds`` (the median of the timed
    passes), ``mad_seconds``, ``repeats``, ``pass_seconds`` (each pass's slowest rank's) and
    ``threads``; None where this rank or another could
    not copy the model or make a pass (each tells the others through ``agree``, an infinite
    pass, so that all give up together rather than leave one waiting; but a rank that fails
    inside a loss that issues its own collectives leaves the others in that collective, which
    nothing generic can pair up). A cell's
    ranks call it right after a barrier, so that their passes run at once. ``agree``: the slowest
    rank's time from this rank's (a max over the ranks). Of the first pass, so that every rank
    makes as many passes: a model's loss may hold collectives of its own (SwAV's Sinkhorn sums
    its codes over the ranks). And of each timed pass, which is then that pass's time.
    ``most``: no more timed passes than this (a cell's timed steps: its figure is then no surer
    than the step it predicts, and a one-step cell pays two passes, not eleven). ``world_size``:
    the ranks' count, where the loss may issue collectives of its own: the untimed first pass
    counts them (``collectives``: calls and bytes per kind), since they are in the figure and a
    step's count of its collectives holds them too. (The count makes that pass slower, and so
    may leave fewer timed passes in the budget: never fewer than ``REPEATS[0]``.)"""
    from shardbench.metrics.comm import CollectiveCounter
    from shardbench.metrics.timing import synchronize
    from shardbench.prediction.flops import ForwardBackward

    devices = [device.index or 0] if device.type == "cuda" else []
    times: list[float] = []
    with torch.random.fork_rng(devices=devices):

        def one_pass(step: ForwardBackward) -> float:
            step.zero_grad(set_to_none=True)  # as a training step leaves them
            synchronize(device)
            started = time.perf_counter()
            step(inputs)
            synchronize(device)
            return time.perf_counter() - started

        counter = CollectiveCounter(world_size) if world_size else None
        try:  # the copy and the first pass: a rank that fails them says so in the agreement
            step = ForwardBackward(copy.deepcopy(model), loss, autocast, device.type)
            with counter or contextlib.nullcontext():
                first = one_pass(step)
        except Exception:  # noqa: BLE001 - every rank gives the figure up together, below
            step, first = None, math.inf
        slowest = agree(first)  # the slowest rank's first pass sets how many fit in the budget
        if step is None or not math.isfinite(slowest):
            return None
        low, high = min(REPEATS[0], most), min(REPEATS[1], most)
        passes = min(high, max(low, int(BUDGET_S / max(slowest, 1e-6))))
        for _ in range(passes):
            try:
                seconds = one_pass(step)
            except Exception:  # noqa: BLE001 - as a failed first pass: all give up together
                seconds = math.inf
            # the pass's slowest rank: a data-parallel step's compute ends when the slowest
            # rank's does, whichever that is this time (the agreement also starts the next pass)
            times.append(agree(seconds))
            if not math.isfinite(times[-1]):
                return None
        del step
    median = statistics.median(times)
    return {
        "seconds": median,
        "mad_seconds": statistics.median(abs(t - median) for t in times),
        "repeats": len(times),
        "pass_seconds": times,
        "threads": torch.get_num_threads(),
        "collectives": {k: {"calls": v["calls"], "bytes": v["bytes"]} for k, v in counter.ops.items()}
        if counter
        else {},
    }


def fits(model: torch.nn.Module, ranks: int, free_bytes: int | None) -> bool:
    """Whether ``ranks`` copies of ``model`` at once, with their gradients, fit in half the free
    memory (where known): a copy to time must never be what fails a cell."""
    if free_bytes is None:
        return True
    held = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    return 2 * held * ranks <= free_bytes / 2
