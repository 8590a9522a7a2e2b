"""The largest model (or batch) that trains within a per-rank memory budget.

``shardbench max-size`` bisects over a workload's size ladder (``--vary params``) or over the
batch size (``--vary batch``: doubling until a probe fails, then bisection). Every probe is an
ordinary cell run by ``bench.harness.launch.run_cell``, so it runs in fresh processes with a timeout: an
OOM, a crash or a hang in one probe is recorded and never poisons the next.

A probe *fits* when it finishes and its peak is within the budget. On CUDA (real tensors) the
budget is enforced by the allocator, ``torch.cuda.set_per_process_memory_fraction`` (one large
card plays a 16 or 80 GiB card), so a probe that does not fit dies with a real OOM. On CPU, or
under ``--fake``, nothing enforces a cap: the probe's tracked peak is compared with the budget.
A probe that fails for another reason (error, timeout) counts as not fitting and is reported with
its status, so the answer never silently rests on a crash.

Probe records (suite ``max-size-probe``) and one summary record per search (suite ``max-size``,
with a ``max_size`` dict) go to ``records.jsonl`` like any other record.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.harness.config import CellConfig
from bench.harness.launch import run_cell
from bench.harness.records import Record, append_record, first_line

VARY = ("params", "batch")
MAX_BATCH = 1 << 16  # the doubling phase stops here: a search must end
_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_UNITS |= {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_budget(text: str) -> int:
    """Bytes from a size such as ``16GiB``, ``512MiB``, ``1.5GB`` or ``1048576``."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise ValueError(
            f"cannot read memory budget {text!r}: give a number and a unit, e.g. 16GiB, 512MiB, "
            "2GB (units: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
        )
    nbytes = int(float(m.group(1)) * _UNITS[unit])
    if nbytes <= 0:
        raise ValueError(f"memory budget must be positive, got {text!r}")
    return nbytes


@dataclass
class Probe:
    """One probe's outcome, from its record."""

    value: str | int  # a preset (vary params) or a batch size (vary batch)
    record: Record
    fits: bool

    @property
    def peak(self) -> int | None:
        return (self.record.peak_mem_bytes or {}).get("max")

    def summary(self) -> dict[str, Any]:
        r = self.record
        return {
            "preset": r.preset,
            "batch_size": r.batch_size_per_rank,
            "params": r.params,
            "peak_bytes": self.peak,
            "status": r.status,
        }


def fits_by(cell: CellConfig) -> str:
    return "cuda memory fraction" if cell.device == "cuda" and not cell.fake else "tracked peak"


def probe_fits(record: Record, budget: int) -> bool:
    peak = (record.peak_mem_bytes or {}).get("max")
    return record.status == "ok" and peak is not None and peak <= budget


def search(
    base: CellConfig,
    *,
    budget: int,
    vary: str,
    ladder: tuple[str, ...] | None = None,
    out_dir: Path,
    run_id: str,
    progress: Callable[[str], None] = print,
    known: dict[str, Record] | None = None,
) -> Record:
    """Run the search for one cell (its preset or batch size is what varies); append every
    probe's record and the summary record to ``out_dir/records.jsonl``; return the summary.

    ``known`` maps presets to records already measured for exactly this cell (e.g. the claim's
    memory cells): they count as probes without being run again and bound the bisection."""
    known = {k: v for k, v in (known or {}).items() if v.status == "ok"}
    if vary not in VARY:
        raise ValueError(f"unknown --vary {vary!r}; allowed: {', '.join(VARY)}")
    enforced = fits_by(base) == "cuda memory fraction"
    base = replace(base, suite="max-size-probe", memory_budget_bytes=budget if enforced else None)
    probes: list[Probe] = []

    def measure(cell: CellConfig) -> Record:
        record = run_cell(cell, run_id=run_id)
        append_record(out_dir / "records.jsonl", record)
        return record

    def probe(value: str | int) -> bool:
        cell = replace(base, preset=value) if vary == "params" else replace(base, batch_size=int(value))
        if vary == "params" and value in known:
            record, reused = known[str(value)], " (already measured)"
        else:
            record, reused = measure(cell), ""
            if record.status == "timeout":  # once more with twice the time before calling it one
                progress(f"[probe {len(probes) + 1}] timed out after {cell.timeout_s:g}s; retrying once")
                record = measure(replace(cell, timeout_s=2 * cell.timeout_s))
        p = Probe(value, record, probe_fits(record, budget))
        probes.append(p)
        progress(_line(len(probes), cell, p, budget) + reused)
        if record.status not in SIZE_ANSWERS:
            raise SearchFailed(p)
        return p.fits

    if vary == "params" and not ladder:
        raise ValueError(f"workload {base.workload!r} has no size ladder to search")
    try:
        values, lo, hi = _search(probe, base, vary, list(ladder or ()), budget, known)
    except SearchFailed as failed:
        summary = _failed_summary(base, failed.probe, probes, budget=budget, vary=vary, run_id=run_id)
    else:
        by_value = {p.value: p for p in probes}
        largest = by_value.get(values[lo]) if lo >= 0 else None
        smallest_fail = by_value.get(values[hi]) if hi < len(values) else None
        summary = _summary(base, largest, smallest_fail, probes, budget=budget, vary=vary, run_id=run_id)
    append_record(out_dir / "records.jsonl", summary)
    progress(summary.note)
    return summary


def _search(
    probe: Callable[[Any], bool],
    base: CellConfig,
    vary: str,
    values: list[Any],
    budget: int,
    known: dict[str, Record],
) -> tuple[list[Any], int, int]:
    """The bisection: (values, index of the largest fit or -1, index of the smallest non-fit)."""
    if vary == "params":
        ceiling = analytic_ceiling(base, values, budget)
        lo, hi = -1, ceiling
        for i, v in enumerate(values[:ceiling]):
            if v in known:
                if probe(v):
                    lo = max(lo, i)
                else:
                    hi = min(hi, i)
        lo = min(lo, hi - 1)
        lo, hi = _bisect(probe, values, lo, hi)
        if hi == ceiling < len(values) and hi == lo + 1:
            probe(values[hi])  # the boundary is measured, not predicted
        return values, lo, hi
    return _search_batch(probe)


#: probe statuses that answer "does this size fit?": a measured peak (over the budget or not), or
#: an out-of-memory. Anything else (an error, a timeout twice, divergence) is a broken probe: the
#: search stops and says so, rather than treating a crash as a size that does not fit.
SIZE_ANSWERS = ("ok", "oom")


class SearchFailed(Exception):
    def __init__(self, probe: Probe) -> None:
        super().__init__(probe.record.status)
        self.probe = probe


def _failed_summary(
    base: CellConfig, failed: Probe, probes: list[Probe], *, budget: int, vary: str, run_id: str
) -> Record:
    """The summary of a search a broken probe stopped: the probe's status and first error line,
    and what had fitted so far (for the record, not as an answer)."""
    fitted = [p for p in probes if p.fits]
    best = max(
        fitted,
        key=lambda p: p.record.params if vary == "params" else p.record.batch_size_per_rank,
        default=None,
    )
    info = {
        "vary": vary,
        "budget_bytes": budget,
        "fits_by": fits_by(base),
        "largest_fit": None,
        "smallest_fail": None,
        "fitted_before_failure": best.summary() if best else None,
        "failed_probe": failed.summary(),
        "probes": len(probes),
    }
    r = failed.record
    what = f"{r.preset} b={r.batch_size_per_rank}"
    error = f"search stopped: probe {what} ended {r.status}: {first_line(r.error) or 'no error text'}"
    head = f"max-size {base.workload} {base.strategy} N={base.world_size} budget {_gib(budget)}"
    return replace(
        r,
        suite="max-size",
        status=r.status,
        error=error,
        max_size=info,
        note=f"{head}: {error}",
        run_id=run_id,
    )


def analytic_ceiling(base: CellConfig, ladder: list[str], budget: int) -> int:
    """Index of the first preset whose *predicted model states alone* exceed the budget (or the
    ladder's length). Model states are a lower bound of the peak, so nothing from there on can
    fit; the search never allocates a model many times the budget (a 20B DDP probe would take
    320 GB of host memory). Only the first such preset may still be probed, to measure the
    boundary."""
    from bench.harness.result import predict
    from models.registry import get_workload

    workload = get_workload(base.workload)
    for i, preset in enumerate(ladder):
        params = workload.param_count(preset)
        if predict(replace(base, preset=preset), base.world_size, params)["total"] > budget:
            return i
    return len(ladder)


def _bisect(fits: Callable[[Any], bool], values: list[Any], lo: int, hi: int) -> tuple[int, int]:
    """values[lo] fits (or lo = -1), values[hi] does not (or hi = len): narrow to neighbours."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(values[mid]):
            lo = mid
        else:
            hi = mid
    return lo, hi


def _search_batch(fits: Callable[[Any], bool]) -> tuple[list[int], int, int]:
    """Double the batch from 1 until a probe does not fit, then bisect the last interval."""
    good, bad = 0, None
    b = 1
    while b <= MAX_BATCH:
        if not fits(b):
            bad = b
            break
        good, b = b, b * 2
    if bad is None:  # everything up to MAX_BATCH fitted
        values = list(range(1, good + 1))
        return values, good - 1, good
    values = list(range(1, bad + 1))
    lo, hi = _bisect(fits, values, good - 1, bad - 1)
    return values, lo, hi


def _summary(
    base: CellConfig,
    largest: Probe | None,
    smallest_fail: Probe | None,
    probes: list[Probe],
    *,
    budget: int,
    vary: str,
    run_id: str,
) -> Record:
    """The search's answer as a record: the largest fit's record (its measurements describe what
    fits), re-labelled, with the ``max_size`` dict; "oom" when nothing fits (the smallest size
    was measured over the budget: a search only gets here when every probe answered)."""
    source = largest or smallest_fail or probes[0]
    info = {
        "vary": vary,
        "budget_bytes": budget,
        "fits_by": fits_by(base),
        "largest_fit": largest.summary() if largest else None,
        "smallest_fail": smallest_fail.summary() if smallest_fail else None,
        "probes": len(probes),
    }
    status = "ok" if largest else "oom"
    error = None
    if not largest:
        error = f"nothing fits in {_gib(budget)}: {first_line(source.record.error) or 'over budget'}"
    return replace(
        source.record,
        suite="max-size",
        status=status,
        error=error,
        max_size=info,
        note=answer_line_from(info, base),
        run_id=run_id,
    )


def _gib(nbytes: int | None) -> str:
    return "?" if nbytes is None else f"{nbytes / 2**30:.2f} GiB"


def _what(p: dict[str, Any], vary: str) -> str:
    if vary == "batch":
        return f"batch {p['batch_size']}"
    return f"{p['preset']} ({p['params'] / 1e6:.1f}M params)"


def _line(i: int, cell: CellConfig, p: Probe, budget: int) -> str:
    r = p.record
    what = f"{r.workload}/{r.preset} ({r.params / 1e6:.1f}M params) b={r.batch_size_per_rank}"
    verdict = "fits" if p.fits else ("does not fit" if r.status == "ok" else f"does not fit ({r.status})")
    peak = f"peak {_gib(p.peak)}" if p.peak is not None else first_line(r.error, 80)
    return (
        f"[probe {i}] {what} {cell.strategy} N={r.world_size}: {verdict} - {peak} vs budget "
        f"{_gib(budget)} ({r.wall_s or 0:.0f}s)"
    )


def answer_line_from(info: dict[str, Any], cell: CellConfig) -> str:
    vary = info["vary"]
    fit, fail = info["largest_fit"], info["smallest_fail"]
    head = f"max-size {cell.workload} {cell.strategy} N={cell.world_size} budget {_gib(info['budget_bytes'])}"
    got = f"largest fit: {_what(fit, vary)}, peak {_gib(fit['peak_bytes'])}" if fit else "nothing fits"
    if fail:
        why = "" if fail["status"] == "ok" else f" [{fail['status']}]"
        lost = f"smallest that did not fit: {_what(fail, vary)}, peak {_gib(fail['peak_bytes'])}{why}"
    else:
        lost = "everything probed fits"
    return f"{head}: {got}; {lost}"
