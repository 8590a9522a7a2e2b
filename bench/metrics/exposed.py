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
    from bench.harness.records import Record


@dataclass(frozen=True)
class Exposed:
    fraction: float  # of the real step
    verdict: str  # "within noise", "beyond noise: ...", or "N timed steps: too few ..."

    def text(self) -> str:
        if self.verdict == "within noise":
            return f"{self.fraction:.0%} (within noise)"
        if self.verdict.endswith("too few to tell from noise"):
            return f"{self.fraction:.0%} (too few steps)"
        return f"{self.fraction:.0%}"


def _cell(r: Record) -> tuple:
    return (
        r.workload,
        r.preset,
        r.strategy,
        r.world_size,
        r.precision,
        r.batch_size_per_rank,
        r.activation_checkpointing,
        r.device,
    )


def exposed_comm(records: Sequence[Record]) -> dict[int, Exposed]:
    """``{id(record): Exposed}`` for every ok real-rank record whose simulated twin (same cell,
    ``--simulate``, not fake) is among ``records`` and timed."""
    from bench.studies.compare_rules import step_time_noise

    twins = {
        _cell(r): r
        for r in records
        if r.simulated and not r.fake and r.status == "ok" and (r.step_time_s or {}).get("median")
    }
    out = {}
    for r in records:
        twin = twins.get(_cell(r))
        real = (r.step_time_s or {}).get("median")
        if r.simulated or r.status != "ok" or twin is None or not real:
            continue
        verdict = step_time_noise(r, twin, base_label="the compute-only twin") or ""
        out[id(r)] = Exposed((real - twin.step_time_s["median"]) / real, verdict)
    return out
