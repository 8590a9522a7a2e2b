"""Exposed communication: how much of a real step is spent waiting for collectives that compute
did not hide.

A real cell's step time is compute plus the communication backward could not overlap. The same
cell run as a simulated world (``--simulate``: rank 0 of a fake process group, the same model,
batch, strategy and hooks, but collectives that return at once) times the compute alone, so

    exposed = (real step - simulated twin's step) / real step

is the fraction of the real step that communication added. It is a difference of two medians,
each with its MAD, so when the difference is within their combined noise (``compare``'s rule,
``step_time_noise``) it is reported as within noise rather than as a fraction. On CUDA the
profiler trace of one step says the same from the kernels themselves
(``shardbench.metrics.kernel_overlap.trace_overlap``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardbench.records import CellKey, Record, oversubscription
from shardbench.studies.compare_rules import step_time_noise


@dataclass(frozen=True)
class Exposed:
    fraction: float  # of the real step
    verdict: str  # "within noise", "beyond noise: ...", or "N timed steps: too few ..."
    #: the real ranks outnumbered the host's cores (or devices): the difference includes waiting
    #: for a turn, which the twin (alone on the host) never does
    crowded: str | None = None

    def text(self) -> str:
        notes = []
        if self.verdict == "within noise":
            notes.append("within noise")
        elif self.verdict.endswith("too few to tell from noise"):
            notes.append("too few steps")
        if self.crowded:
            notes.append(self.crowded)
        return f"{self.fraction:.0%}" + (f" ({', '.join(notes)})" if notes else "")


def _twin_key(r: Record) -> tuple:
    """The cell ``compare`` would call it, less how its world was run (real or simulated)."""
    return CellKey.of(r).without("simulated", "fake")


def exposed_comm(records: Sequence[Record]) -> dict[int, Exposed]:
    """``{id(record): Exposed}`` for every ok real-rank record whose simulated twin (same cell,
    ``--simulate``, not fake) is among ``records`` and timed."""
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
        out[id(r)] = Exposed((real - twin.step_time_s["median"]) / real, verdict, oversubscription(r))
    return out
