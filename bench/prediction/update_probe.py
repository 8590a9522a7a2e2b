"""An update probe: the seconds one AdamW step takes per parameter element on this CPU, at a
thread count; the step-time model's optimizer term (``bench/prediction/step_time.py``).

The optimizer step is not counted in a step's FLOPs (``flops.py``) and is memory-bound: AdamW
reads a parameter, its gradient and two moments and writes three of them back, so its time
grows with the elements a rank updates (all of them under ddp, its 1/N share under ZeRO), not
with FLOPs. The method is fixed: ``torch.optim.AdamW`` with the implementation the harness pins
for the CPU (``metrics.kernels.pin_implementation``) over ``TENSORS`` fp32 tensors of ``ELEMENTS``
elements in all, gradients of ones; one untimed step, then ``REPEATS`` timed; the median over
the elements is the figure. Its rate depends on where the optimizer state lives: a few million
elements stay in a large last-level cache, a base model's hundred million stream from memory at
a third of that rate. So the step-time model probes at the size a rank updates (``size_for``:
the next power of two, within ``SIZES``), and with its ranks' ``copies`` stepping at once in as
many threads, since the ranks of a host update at the same moment and share its memory
bandwidth. Under a second on a 2-core CPU at the largest size.

Each tensor also costs a fixed time: the loop implementation the CPU pins runs a dozen small
kernels per tensor (tens of microseconds on a small CPU), which for a model of a hundred small
tensors weighs as much as its elements. ``probe_per_tensor`` measures it on ``MANY_TENSORS``
tensors of ``SMALL`` elements each; the step-time model adds it per tensor the rank's optimizer
steps over (``metrics/optimizer_tensors.py``).

The rate also follows each tensor's size, not only their sum: the loop implementation allocates
temporaries the size of the tensor it steps, and the allocator maps a large one (tens of MiB)
afresh each time, paying a page fault and zeroing on every byte, where a small one reuses memory
it has freed. On the 2-core machine at 64M elements in all, two copies at once: 6.1 ns per
element over tensors of 32 MiB, 3.6 over tensors of 8 MiB, 3.4 over 2 MiB. So where the record
lists the tensors the rank's optimizer steps over (``optimizer_tensor_elements``), ``replay``
steps AdamW over tensors of exactly those sizes, in their order, at the rank's threads and
copies: the update's seconds, per-tensor cost included. The rate probe stands where they are
unknown, too large to replay beside the copies, or fewer than ``REPLAY_FROM`` elements.

``probe_buffer_memory`` measures what a step pays per byte for communication buffers beyond
their collectives: a copy through a buffer (FSDP2 copies each unit's gathered parameters out
of its all-gather's buffer, and the gradients into a reduce-scatter buffer) and the first touch
of a buffer allocated for a gather (zero3 and FSDP2 free a unit's gathered parameters after
use and allocate them again at the next gather; the allocator maps large blocks afresh, and on
a CPU each fresh page costs a fault and zeroing, about what copying into it costs). It copies
``COPY_BYTES`` into one tensor kept across copies, and into a tensor allocated for each copy:
the first is the copy, the difference the first touch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

ELEMENTS = 1 << 22
TENSORS = 8
#: the per-tensor probe: this many tensors of ``SMALL`` elements, whose step is all per-tensor cost
MANY_TENSORS = 256
SMALL = 16
REPEATS = 3
#: the buffer-memory probe's bytes a copy: a base model's unit, past the allocator's reuse of
#: freed blocks (large allocations are mapped afresh)
COPY_BYTES = 1 << 25
#: its timed copies: each costs milliseconds
COPY_REPEATS = 5
#: a replay's copies, all together: a large model's update takes seconds a step
REPLAY_TIMEOUT_S = 600
#: the sizes probed: from a cache-resident 1M elements to 128M (2 GiB of parameter, gradient
#: and moments, past any cache)
SIZES = tuple(1 << k for k in range(20, 28))


#: the fewest elements a rank's update is replayed at: below, the rate probe's tensors (an eighth
#: of its size each, at most 2 MiB) are in the same regime as a small model's, its per-tensor
#: cost is measured as one process's own, and the replay's processes would take longer to start
#: than the update they measure
REPLAY_FROM = 1 << 22


#: bytes a probed element holds: parameter, gradient, two moments, and foreach AdamW's temporaries
BYTES_PER_ELEMENT = 32


def size_for(elements: int, copies: int = 1, memory: int | None = None) -> int:
    """The probed size standing for a rank that updates ``elements``: the next in ``SIZES``, but
    no larger than ``copies`` of it fit in half of ``memory`` (the bytes free, where known)."""
    size = next((s for s in SIZES if s >= elements), SIZES[-1])
    if memory is not None:
        fitting = [s for s in SIZES if copies * s * BYTES_PER_ELEMENT <= memory / 2]
        size = min(size, fitting[-1] if fitting else SIZES[0])
    return size


def probe_per_tensor(threads: int, copies: int = 1) -> dict[str, Any]:
    """The fixed seconds one AdamW step spends per tensor at ``threads``, ``copies`` at once:
    ``seconds_per_tensor`` (the median of the slowest copy's steps over ``MANY_TENSORS`` tensors
    of ``SMALL`` elements), ``mad_seconds_per_tensor``, ``tensors``, ``repeats``, ``threads``,
    ``copies``."""
    measured = _timed_steps(threads, [SMALL] * MANY_TENSORS, copies)
    return {
        "seconds_per_tensor": measured["median"] / MANY_TENSORS,
        "mad_seconds_per_tensor": measured["mad"] / MANY_TENSORS,
        "tensors": MANY_TENSORS,
        "repeats": REPEATS,
        "threads": threads,
        "copies": copies,
    }


def slowest(times: list[list[float]]) -> list[float]:
    """Per timed repeat, the slowest copy's time: copies that run at once finish with the last."""
    return [max(repeat) for repeat in zip(*times, strict=True)]


def probe_buffer_memory(threads: int, copies: int = 1, nbytes: int = COPY_BYTES) -> dict[str, Any]:
    """A byte copied and a byte first touched, at ``threads``, ``copies`` at once:
    ``seconds_per_copied_byte`` (``nbytes`` copied into a tensor kept across copies),
    ``seconds_per_fresh_byte`` (copied into a tensor allocated for each copy, less the former;
    never below zero), each the median of the slowest copy's ``COPY_REPEATS`` timed copies after
    an untimed one; ``bytes``, ``repeats``, ``threads``, ``copies``."""
    import torch

    from shardbench.prediction.at_once import at_once

    def copies_of(index: int, together: Callable[[], None]) -> tuple[list[float], list[float]]:
        source = torch.ones(nbytes // 4)
        kept = torch.empty_like(source)
        kept.copy_(source)
        torch.empty_like(source).copy_(source)
        into_kept, into_fresh = [], []
        for _ in range(COPY_REPEATS):
            together()
            started = time.perf_counter()
            kept.copy_(source)
            copied = time.perf_counter()
            torch.empty_like(source).copy_(source)  # allocated, touched, copied, freed
            into_kept.append(copied - started)
            into_fresh.append(time.perf_counter() - copied)
        return into_kept, into_fresh

    measured = at_once(copies_of, copies, threads)
    kept = statistics.median(slowest([m[0] for m in measured]))
    fresh = statistics.median(slowest([m[1] for m in measured]))
    return {
        "seconds_per_copied_byte": kept / nbytes,
        "seconds_per_fresh_byte": max(0.0, fresh - kept) / nbytes,
        "bytes": nbytes,
        "repeats": COPY_REPEATS,
        "threads": threads,
        "copies": copies,
    }


def probe(threads: int, elements: int = ELEMENTS, copies: int = 1) -> dict[str, Any]:
    """Measure ``elements`` at ``threads``, ``copies`` at once: ``seconds_per_element`` (the
    median of the slowest copy's steps), ``mad_seconds_per_element``, ``elements``, ``repeats``,
    ``threads``, ``copies``."""
    measured = _timed_steps(threads, [elements // TENSORS] * TENSORS, copies)
    median = measured["median"] / elements
    return {
        "seconds_per_element": median,
        "mad_seconds_per_element": measured["mad"] / elements,
        "elements": elements,
        "repeats": REPEATS,
        "threads": threads,
        "copies": copies,
    }


def replay(sizes: Sequence[int], threads: int, copies: int = 1) -> dict[str, Any]:
    """The update of a rank whose optimizer steps over tensors of ``sizes`` elements (in that
    order), replayed at ``threads``, ``copies`` at once, each in a process of its own as the
    ranks are (``processes_at_once``: a small model's update is Python between small kernels,
    which threads of one process would take turns at): ``seconds`` (the median of the slowest
    copy's steps), ``mad_seconds``, ``tensors``, ``elements``, ``repeats``, ``threads``,
    ``copies``."""
    from shardbench.prediction.processes_at_once import run_at_once

    request = {"sizes": list(sizes), "threads": threads}
    answers = run_at_once("shardbench.prediction.update_probe", request, copies, REPLAY_TIMEOUT_S)
    measured = _median_of_slowest([a["times"] for a in answers])
    return {
        "seconds": measured["median"],
        "mad_seconds": measured["mad"],
        "tensors": len(sizes),
        "elements": sum(sizes),
        "repeats": REPEATS,
        "threads": threads,
        "copies": copies,
    }


def _replay_copy() -> None:
    """One copy of ``replay``, in its own process."""
    import torch

    from shardbench.prediction.processes_at_once import Together, answer, read_request

    request = read_request()
    together = Together(request)
    torch.set_num_threads(int(request["threads"]))
    answer({"times": _steps(_optimizer(request["sizes"]), together)})


def _timed_steps(threads: int, sizes: list[int], copies: int) -> dict[str, float]:
    """AdamW (the CPU's pinned implementation) over fp32 tensors of ``sizes`` elements,
    gradients of ones: one untimed step, then ``REPEATS`` timed, ``copies`` at once; the
    ``median`` and ``mad`` seconds of a step of the slowest copy."""
    from shardbench.prediction.at_once import at_once

    def copy(index: int, together: Callable[[], None]) -> list[float]:
        return _steps(_optimizer(sizes), together)

    return _median_of_slowest(at_once(copy, copies, threads))


def _median_of_slowest(times: list[list[float]]) -> dict[str, float]:
    """The ``median`` and ``mad`` seconds of a step of the slowest copy, over the copies' timed
    steps."""
    per = slowest(times)
    median = statistics.median(per)
    return {"median": median, "mad": statistics.median(abs(p - median) for p in per)}


def _optimizer(sizes: Sequence[int]) -> Any:
    """AdamW, the CPU's pinned implementation, over fp32 tensors of ``sizes`` elements whose
    gradients are ones."""
    import torch

    from shardbench.metrics.kernels import pin_implementation

    params = [torch.nn.Parameter(torch.zeros(size)) for size in sizes]
    for p in params:
        p.grad = torch.ones_like(p)
    return pin_implementation(torch.optim.AdamW(params, lr=1e-3), "cpu")


def _steps(optimizer: Any, together: Callable[[], None]) -> list[float]:
    """One untimed step, then ``REPEATS`` timed, each after ``together()``: their seconds."""
    optimizer.step()
    times = []
    for _ in range(REPEATS):
        together()
        started = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - started)
    return times


if __name__ == "__main__":
    _replay_copy()
