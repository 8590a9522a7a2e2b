"""Communication that compute did not hide, from the kernels of one profiled step.

On CUDA the profiler trace of a step says how much of the NCCL kernels' time ran while no
compute kernel did (``trace_overlap``); the step-time route (a real cell against its simulated
twin) is ``shardbench.studies.exposed_comm``.
"""

from __future__ import annotations


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length where two sorted, disjoint interval lists overlap."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def trace_overlap(trace: dict) -> dict[str, float] | None:
    """From a ``torch.profiler`` Chrome trace of one step (``--trace`` on CUDA): how long NCCL
    kernels ran, how much of that compute kernels covered, and the rest, exposed, as a fraction
    of the step (the span of everything the trace recorded). None without any NCCL kernel (a
    CPU trace, a simulated world): nothing to say from the kernels.

    Kernels are the events of category ``kernel``; a collective's kernel is named ``nccl...``
    (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``); every other kernel is compute."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and "ts" in e]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    comm = _union([(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" in e.get("name", "").lower()])
    if not comm:
        return None
    others = [e for e in kernels if "nccl" not in e.get("name", "").lower()]
    compute = _union([(e["ts"], e["ts"] + e["dur"]) for e in others])
    step = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
    busy, hidden = _length(comm), _intersection(comm, compute)
    return {
        "comm_s": busy / 1e6,  # the trace's clock is in microseconds
        "overlapped_s": hidden / 1e6,
        "exposed_s": (busy - hidden) / 1e6,
        "step_s": step / 1e6,
        "exposed_fraction": (busy - hidden) / step if step > 0 else 0.0,
    }
