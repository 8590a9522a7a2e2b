"""Exposed communication: how much of a real step is spent waiting for collectives that compute
did not hide.

A real cell's step time is compute plus the communication backward could not overlap. The same
cell run as a simulated world (``--simulate``: rank 0 of a fake process group, the same model,
batch, strategy and hooks, but collectives that return at once) times the compute alone, so

    exposed = (real step - simulated twin's step) / real step

is the fraction of the real step that communication added. It is a difference of two medians,
each with its MAD, so when the difference is within their combined noise (``compare``'s rule,
``step_time_noise``) it is reported as within noise rather than as a fraction. On CUDA the
profiler trace of one step says the same from the kernels themselves (``trace_overlap``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardbench.records import Record


@dataclass(frozen=True)
class Exposed:
    fraction: float  # of the real step
    verdict: str  # "within noise", "beyond noise: ...", or "N timed steps: too few ..."
    #: the real ranks outnumbered the host's cores: the difference includes waiting for a core,
    #: which the twin (alone on the host) never does
    crowded: bool = False

    def text(self) -> str:
        notes = []
        if self.verdict == "within noise":
            notes.append("within noise")
        elif self.verdict.endswith("too few to tell from noise"):
            notes.append("too few steps")
        if self.crowded:
            notes.append("more ranks than cores")
        return f"{self.fraction:.0%}" + (f" ({', '.join(notes)})" if notes else "")


def _twin_key(r: Record) -> tuple:
    """The cell ``compare`` would call it, less how its world was run (real or simulated)."""
    from shardbench.studies.compare import identity
    from shardbench.studies.compare_rules import CELL_FIELDS

    return tuple(v for k, v in zip(CELL_FIELDS, identity(r), strict=True) if k not in ("simulated", "fake"))


def exposed_comm(records: Sequence[Record]) -> dict[int, Exposed]:
    """``{id(record): Exposed}`` for every ok real-rank record whose simulated twin (same cell,
    ``--simulate``, not fake) is among ``records`` and timed."""
    from shardbench.studies.compare_rules import step_time_noise

    twins = {
        _twin_key(r): r
        for r in records
        if r.simulated and not r.fake and r.status == "ok" and (r.step_time_s or {}).get("median")
    }
    out = {}
    for r in records:
        twin = twins.get(_twin_key(r))
        real = (r.step_time_s or {}).get("median")
        if r.simulated or r.status != "ok" or twin is None or not real:
            continue
        threads = (r.threads_per_rank, twin.threads_per_rank)
        if None not in threads and threads[0] != threads[1]:
            continue  # the twin computed with other threads: its time is not this rank's compute
        verdict = step_time_noise(r, twin, base_label="the compute-only twin") or ""
        cores = r.env.get("cpu_count")
        crowded = r.device == "cpu" and isinstance(cores, int) and r.world_size > cores
        out[id(r)] = Exposed((real - twin.step_time_s["median"]) / real, verdict, crowded)
    return out


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
