"""The largest model (or batch) that trains within a per-rank memory budget.

``shardbench max-size`` bisects over a workload's size family (``--vary params``: every shape
``models/presets/family.py`` allows, sorted by parameters, until the largest fit and the
smallest non-fit are within ``--resolution``, 3% by default; or over an explicit ``--ladder`` of
presets) or over the batch size (``--vary batch``: batches 1 and 2 predict the answer from
the peak's growth per sample, probes beside the prediction confirm it, bisection settles a
miss). Every probe is an ordinary cell run by ``shardbench.harness.launch.run_cell``, so it runs in
fresh processes with a timeout: an OOM, a crash or a hang in one probe is recorded and never
poisons the next.

A probe *fits* when it finishes and its peak, with the reserve ``plan`` keeps beside it, is within
the budget: ``Reserve.fits`` (``bench/studies/plan_reserve.py``), the rule and the policy ``plan``
judges by, so the two never disagree about one model. The reserve is 0 on the CPU; on a CUDA
target (real or ``--fake``) it is the allocator's cache at the strategy's worst measured
reserved/allocated ratio plus the CUDA context where measured, or ``--reserve``. Each search says
so on its line and keeps the budget and the reserve in its record. On CUDA (real tensors) the
card is also emulated by the allocator, ``torch.cuda.set_per_process_memory_fraction`` capping it
at the budget less the reserve's fixed part (what the context leaves it; one large card plays a
16 or 80 GiB card), so a probe that does not fit may die with a real OOM. On CPU, or under
``--fake``, nothing enforces a cap: the probe's tracked peak is judged.
A probe that fails for another reason (an error, a timeout twice, divergence) stops the search
with that status and the probe's first error line: a crash is a broken search, never a size that
does not fit, and "nothing fits" is only said when the smallest size was measured over budget.

Probe records (suite ``max-size-probe``) and one summary record per search (suite ``max-size``,
with a ``max_size`` dict) go to ``records.jsonl`` like any other record.
"""

from __future__ import annotations

import bisect
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shardbench.harness.config import CellConfig
from shardbench.harness.launch import JobCells, run_cell
from shardbench.harness.result import with_slow_start
from shardbench.records import Record, append_record
from shardbench.studies.plan_reserve import NO_RESERVE, Reserve
from shardbench.units import apart, params_text, size_text
from shardbench.wording import first_sentence, print_wrapped

VARY = ("params", "batch")
#: a params search stops when the largest fit and the smallest non-fit are this close (3%)
DEFAULT_RESOLUTION = 0.03
MAX_BATCH = 1 << 16  # the doubling phase stops here: a search must end
_UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_UNITS |= {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_budget(text: str) -> int:
    """Bytes from a size such as ``16GiB``, ``512MiB``, ``1.5GB`` or ``1048576B``: the unit is
    required (a bare ``12`` could mean 12 GiB as easily as 12 bytes)."""
    return parse_size(text, what="memory budget")


def parse_size(text: str, *, what: str, zero: bool = False) -> int:
    """Bytes from a size (``parse_budget``'s forms); ``zero``: 0 is allowed."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if m and zero and not unit and float(m.group(1)) == 0:  # nothing needs no unit
        return 0
    if not m or unit not in _UNITS:
        raise ValueError(
            f"cannot read {what} {text!r}: give a number and its unit, e.g. 16GiB, 512MiB, "
            "2GB (units: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
        )
    nbytes = int(float(m.group(1)) * _UNITS[unit])
    if nbytes < 0 or (nbytes == 0 and not zero):
        raise ValueError(f"{what} must be {'zero or more' if zero else 'positive'}, got {text!r}")
    return nbytes


@dataclass
class Probe:
    """One probe's outcome, from its record."""

    value: str | int  # a preset (vary params) or a batch size (vary batch)
    record: Record
    fits: bool
    reserve: Reserve = NO_RESERVE

    @property
    def peak(self) -> int | None:
        return (self.record.peak_mem_bytes or {}).get("max")

    @property
    def reserve_bytes(self) -> int | None:
        """What the peak needs beside it (``Reserve.of``)."""
        return None if self.peak is None else self.reserve.of(self.peak)

    def summary(self) -> dict[str, Any]:
        r = self.record
        return {
            "preset": r.preset,
            "batch_size": r.batch_size_per_rank,
            "params": r.params,
            "peak_bytes": self.peak,
            "reserve_bytes": self.reserve_bytes,
            "status": r.status,
        }


def fits_by(cell: CellConfig) -> str:
    return "cuda memory fraction" if cell.device == "cuda" and not cell.fake else "tracked peak"


def probe_fits(record: Record, budget: int, reserve: Reserve = NO_RESERVE) -> bool:
    """A probe that finished, whose peak and reserve are within the budget (``Reserve.fits``,
    ``plan``'s rule)."""
    peak = (record.peak_mem_bytes or {}).get("max")
    return record.status == "ok" and peak is not None and reserve.fits(peak, budget)


def allocator_cap(budget: int, reserve: Reserve) -> int:
    """What an emulated card lets the CUDA allocator hold: the budget less the reserve's fixed part
    (the CUDA context lives outside the allocator). Its cache beside the peak is within the cap;
    the fit itself is still judged by ``Reserve.fits``."""
    return max(1, budget - reserve.fixed)


class _Prober:
    """Measures one size of a search at a time: runs its cell (or reuses a known record), judges
    the fit, keeps the probe, and tells the progress line; a probe that answers nothing about
    the fit (an error, two timeouts) stops the search (``SearchFailed``)."""

    def __init__(self, base: CellConfig, budget: int, reserve: Reserve, vary: str, where: tuple[Path, str],
                 known: dict[str, Record], progress: Callable[[str], None],
                 job_cells: JobCells | None = None) -> None:  # fmt: skip
        self.base, self.budget, self.reserve, self.vary = base, budget, reserve, vary
        self.out_dir, self.run_id = where
        self.known, self.progress, self.job_cells = known, progress, job_cells
        self.probes: list[Probe] = []

    def measure(self, cell: CellConfig) -> Record:
        record = (self.job_cells or run_cell)(cell, run_id=self.run_id)
        append_record(self.out_dir / "records.jsonl", record)
        return record

    def __call__(self, value: str | int) -> bool:
        params = self.vary == "params"
        cell = replace(self.base, preset=value) if params else replace(self.base, batch_size=int(value))
        if params and value in self.known:
            record, reused = self.known[str(value)], " (already measured)"
        else:
            record, reused = self.measure(cell), ""
            if record.status == "timeout":  # once more with twice the time before calling it one
                said = f"[probe {len(self.probes) + 1}] timed out after {cell.timeout_s:g}s; retrying once"
                self.progress(said)
                record = self.measure(replace(cell, timeout_s=2 * cell.timeout_s))
        p = Probe(value, record, probe_fits(record, self.budget, self.reserve), self.reserve)
        self.probes.append(p)
        self.progress(_line(len(self.probes), cell, p, self.budget) + reused)
        if record.status not in SIZE_ANSWERS:
            raise SearchFailed(p)
        return p.fits


def search(
    base: CellConfig,
    *,
    budget: int,
    vary: str,
    ladder: tuple[str, ...] | None = None,
    resolution: float = DEFAULT_RESOLUTION,
    out_dir: Path,
    run_id: str,
    progress: Callable[[str], None] = print_wrapped,
    known: dict[str, Record] | None = None,
    reserve: Reserve = NO_RESERVE,
    job_cells: JobCells | None = None,
) -> Record:
    """Run the search for one cell (its preset or batch size is what varies); append every
    probe's record and the summary record to ``out_dir/records.jsonl``; return the summary.

    ``--vary params`` walks ``ladder`` when given, else the workload's size family (else its
    named ladder), until the largest fit and the smallest non-fit are within ``resolution`` of
    each other in parameters (or neighbours: nothing lies between them). ``known`` maps presets
    to records already measured for exactly this cell (e.g. the claim's memory cells): they
    count as probes without being run again and bound the bisection. ``reserve``: what each peak
    needs beside it within ``budget`` (``plan_reserve.policy(device).of(strategy)``; none by
    default, as on the CPU). ``job_cells``: inside a torchrun or Slurm job, what runs each probe
    on the job's processes."""
    started = time.perf_counter()
    known = {k: v for k, v in (known or {}).items() if v.status == "ok"}
    if vary not in VARY:
        raise ValueError(f"unknown --vary {vary!r}; allowed: {', '.join(VARY)}")
    enforced = fits_by(base) == "cuda memory fraction"
    cap = allocator_cap(budget, reserve) if enforced else None
    base = replace(base, suite="max-size-probe", memory_budget_bytes=cap)
    sizes = SizeAxis.of(base.workload, ladder, base.preset) if vary == "params" else None
    if sizes is not None:
        known = sizes.aliases(known)
    probe = _Prober(base, budget, reserve, vary, (out_dir, run_id), known, progress, job_cells)
    judged = dict(budget=budget, reserve=reserve, vary=vary, run_id=run_id)
    usable = reserve.usable(budget)  # the largest peak that fits with its reserve: where to aim
    try:
        if sizes is None:
            values, lo, hi = _search_batch(probe, _peak_of(probe.probes), usable)
        else:
            values, lo, hi = _search_params(probe, base, sizes, usable, resolution, known)
    except SearchFailed as failed:
        summary = _failed_summary(base, failed.probe, probe.probes, **judged)
    else:
        by_value = {p.value: p for p in probe.probes}
        largest = by_value.get(values[lo]) if lo >= 0 else None
        smallest_fail = by_value.get(values[hi]) if hi < len(values) else None
        extra = sizes.describe(resolution) if sizes is not None else {}
        summary = _summary(base, largest, smallest_fail, probe.probes, **judged, extra=extra)
    summary.max_size["search_wall_s"] = time.perf_counter() - started
    append_record(out_dir / "records.jsonl", summary)
    progress(summary.note)
    return summary


def _peak_of(probes: list[Probe]) -> Callable[[int], int | None]:
    return lambda value: next((p.peak for p in probes if p.value == value), None)


@dataclass(frozen=True)
class SizeAxis:
    """What a ``--vary params`` search walks: preset names and their parameter counts, smallest
    first, and where they came from (a size family, an explicit or the named ladder)."""

    names: list[str]
    params: list[int]
    source: str
    #: how unusual each size's proportions are (0 for a ladder: its presets are all usual)
    distances: list[float]

    @staticmethod
    def of(workload_name: str, ladder: tuple[str, ...] | None, around: str | None = None) -> SizeAxis:
        """``around``: the search's own preset (a workload whose shapes are keyword arguments
        grows that shape: ``models/presets/config_string.depth_family``)."""
        from shardbench.models.registry import get_workload

        workload = get_workload(workload_name)
        family = None if ladder else workload.size_family(around)
        if family is not None:
            params, names = zip(*family.members, strict=True)
            distances = [family.distance(**family.parse(n)) for n in names]
            return SizeAxis(list(names), list(params), f"family {family.spelling}", distances)
        names = list(ladder or workload.ladder)
        if not names:
            raise ValueError(
                f"workload {workload_name!r} has no size family or ladder to search; give --ladder"
            )
        return SizeAxis(names, [workload.param_count(n) for n in names], "ladder", [0.0] * len(names))

    def aliases(self, known: dict[str, Record]) -> dict[str, Record]:
        """``known`` plus, for a named preset (``base``) that is a shape on this axis
        (``h768-l12``), the same record under the axis's name: a claim's memory cell bounds the
        search whatever it was called."""
        from shardbench.models.registry import get_workload

        out = dict(known)
        for name, record in known.items():
            if record.params is None:
                continue
            # sizes are sorted by count, one per count: the only candidate is found by bisection
            i = bisect.bisect_left(self.params, record.params)
            if i < len(self.params) and self.params[i] == record.params and self.names[i] != name:
                if get_workload(record.workload).same_shape(self.names[i], name):
                    out[self.names[i]] = record
        return out

    def describe(self, resolution: float) -> dict[str, Any]:
        return {"sizes": self.source, "target_resolution": resolution}


def _search_params(
    probe: Callable[[Any], bool],
    base: CellConfig,
    sizes: SizeAxis,
    budget: int,
    resolution: float,
    known: dict[str, Record],
) -> tuple[list[str], int, int]:
    """The bisection over sizes: (names, index of the largest fit or -1, index of the smallest
    non-fit or len). It starts below the first size whose predicted model states alone exceed
    ``budget`` (the largest peak that fits with its reserve); that size is probed only if the
    boundary ends next to it (measured, not predicted)."""
    names, counts = sizes.names, sizes.params
    measured: set[str] = set()

    def fits(name: str) -> bool:
        measured.add(name)
        return probe(name)

    ceiling = analytic_ceiling(base, names, counts, budget)
    lo, hi = -1, ceiling
    for name in known:
        if name in names and (i := names.index(name)) < ceiling:
            if fits(name):
                lo = max(lo, i)
            else:
                hi = min(hi, i)
    lo = min(lo, hi - 1)
    while True:
        lo, hi = _bisect(fits, counts, names, lo, hi, resolution, sizes.distances)
        if hi == len(names) or names[hi] in measured or not fits(names[hi]):
            return names, lo, hi  # (the predicted ceiling is measured before it is reported)
        lo, hi = hi, len(names)  # the prediction was wrong: search on above it


#: probe statuses that answer "does this size fit?": a measured peak (over the budget or not), or
#: an out-of-memory. Anything else (an error, a timeout twice, divergence) is a broken probe: the
#: search stops and says so, rather than treating a crash as a size that does not fit.
SIZE_ANSWERS = ("ok", "oom")


class SearchFailed(Exception):
    def __init__(self, probe: Probe) -> None:
        super().__init__(probe.record.status)
        self.probe = probe


def _failed_summary(
    base: CellConfig,
    failed: Probe,
    probes: list[Probe],
    *,
    budget: int,
    reserve: Reserve,
    vary: str,
    run_id: str,
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
        **_judged_by(base, budget, reserve),
        "largest_fit": None,
        "smallest_fail": None,
        "fitted_before_failure": best.summary() if best else None,
        "failed_probe": failed.summary(),
        "probes": len(probes),
    }
    r = failed.record
    what = f"{r.preset} b={r.batch_size_per_rank}"
    error = f"search stopped: probe {what} ended {r.status}: {first_sentence(r.error) or 'no error text'}"
    head = _head(info, base)
    return replace(
        r,
        suite="max-size",
        status=r.status,
        error=error,
        max_size=info,
        note=f"{head}: {error}",
        run_id=run_id,
    )


def analytic_ceiling(base: CellConfig, names: list[str], counts: list[int], budget: int) -> int:
    """Index of the first size whose *predicted model states alone* exceed the budget (or the
    number of sizes). Model states are a lower bound of the peak, so nothing from there on can
    fit; the search never allocates a model many times the budget (a 20B DDP probe would take
    320 GB of host memory). Predictions grow with the parameter count: a bisection finds it."""
    from shardbench.prediction.zero_accounting import predict

    def over(i: int) -> bool:
        return predict(replace(base, preset=names[i]), base.world_size, counts[i])["total"] > budget

    lo, hi = 0, len(names)
    while lo < hi:
        mid = (lo + hi) // 2
        if over(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _bisect(
    fits: Callable[[Any], bool],
    counts: list[int],
    names: list[Any],
    lo: int,
    hi: int,
    resolution: float,
    distances: list[float] | None = None,
) -> tuple[int, int]:
    """names[lo] fits (or lo = -1), names[hi] does not (or hi = len): probe near the geometric
    middle of the two counts until they are within ``resolution`` or neighbours. Of the sizes
    within a quarter of the bracket (in log scale) around the middle, the one with the most
    usual proportions (smallest ``distances``) is probed, the nearest to the middle among equals:
    the probes follow the family's spine rather than whichever odd shape is nearest in size."""

    def close() -> bool:
        return 0 <= lo and hi < len(counts) and counts[hi] <= counts[lo] * (1 + resolution)

    while hi - lo > 1 and not close():
        a = counts[lo] if lo >= 0 else counts[0]
        b = counts[hi] if hi < len(counts) else counts[-1]
        middle, window = math.sqrt(a * b), math.log(b / a) / 4 if b > a else 0.0

        def off(i: int, middle: float = middle) -> float:
            return abs(math.log(counts[i] / middle))

        inside = range(lo + 1, hi)
        near = [i for i in inside if off(i) <= window] or [min(inside, key=off)]
        mid = min(near, key=lambda i: ((distances[i] if distances else 0.0), off(i)))
        if fits(names[mid]):
            lo = mid
        else:
            hi = mid
    return lo, hi


class _BatchBracket:
    """The largest measured fit and the smallest measured non-fit of a batch search, and the
    line through two measured peaks that predicts where the budget is met."""

    def __init__(
        self, fits: Callable[[int], bool], peak_of: Callable[[int], int | None], budget: int
    ) -> None:
        self.fits, self.peak_of, self.budget = fits, peak_of, budget
        self.fit: int = 0
        self.fail: int | None = None

    def test(self, b: int) -> bool:
        ok = self.fits(b)
        if ok:
            self.fit = max(self.fit, b)
        else:
            self.fail = b if self.fail is None else min(self.fail, b)
        return ok

    def predict(self, a: int, b: int) -> int | None:
        """Where the line through the peaks at ``a`` and ``b`` meets the budget."""
        pa, pb = self.peak_of(a), self.peak_of(b)
        if pa is None or pb is None or pb <= pa:
            return None
        return a + (self.budget - pa) * (b - a) // (pb - pa)

    def climb(self) -> None:
        """From batches 1 and 2: probe where their line meets the budget, then gallop up from a
        prediction that fitted; double where nothing predicts (the peak did not grow)."""
        guess = self.predict(1, 2)
        if guess is None:
            while self.fail is None and self.fit < MAX_BATCH:
                self.test(min(MAX_BATCH, 2 * self.fit))
            return
        step = 1
        if self.test(int(min(MAX_BATCH, max(3, guess)))):
            again = self.predict(2, self.fit)  # the line through the two largest fits, when it says more
            if again is not None and again > self.fit:
                self.test(min(MAX_BATCH, again))
            while self.fail is None and self.fit < MAX_BATCH:
                self.test(min(MAX_BATCH, self.fit + step))
                step *= 2

    def narrow(self) -> None:
        """Secants through the nearest fit and non-fit; at least the fit's neighbour (a line that
        says "this fit is the largest" is confirmed by one probe above it). The geometric middle
        instead when there is no secant, or when two probes did not halve the bracket (a curved
        peak, where secants creep), so the search always ends soon."""
        widths: list[int] = []
        while self.fail is not None and self.fail - self.fit > 1:
            widths.append(self.fail - self.fit)
            guess = self.predict(self.fit, self.fail)
            neighbour = guess is not None and guess <= self.fit + 1
            stalled = len(widths) > 2 and widths[-1] > widths[-3] // 2 and not neighbour
            middle = math.isqrt(self.fit * self.fail)  # geometric: 17 to 65536 halves in log
            b = middle if guess is None or stalled else guess
            self.test(min(self.fail - 1, max(self.fit + 1, b)))


def _search_batch(
    fits: Callable[[int], bool], peak_of: Callable[[int], int | None], budget: int
) -> tuple[list[int], int, int]:
    """The largest batch that fits, as indices into ``values = [1, 2, ...]``: ``lo`` fits,
    ``hi`` does not (``len(values)`` when everything up to ``MAX_BATCH`` fitted).

    Batches 1 and 2 are measured; the peak's growth from one to the other (activations grow
    linearly with the batch) predicts the largest batch that fits, which is probed with its
    neighbour; secants between the nearest measured fit and non-fit settle any miss (bisection
    when they stall), so the answer is always a measured fit beside a measured non-fit. A linear
    peak takes four probes whatever the budget (doubling to an 80 GiB card's batch took a dozen);
    a peak that does not grow from batch 1 to 2 predicts nothing, and the batch doubles instead.
    A peak set at batches 1 and 2 by the optimizer step (zero2, zero3: the activations are gone
    by then) grows by the inputs' bytes alone: its far guess fails, and the secant from that
    failure lands on the activations' line, six probes in all (the 1.1B Llama at N = 8)."""
    bracket = _BatchBracket(fits, peak_of, budget)
    if bracket.test(1) and bracket.test(2):
        bracket.climb()
        bracket.narrow()
    fit, fail = bracket.fit, bracket.fail
    if fail is None:
        return list(range(1, fit + 1)), fit - 1, fit
    return list(range(1, fail + 1)), fit - 1, fail - 1


def _summary(
    base: CellConfig,
    largest: Probe | None,
    smallest_fail: Probe | None,
    probes: list[Probe],
    *,
    budget: int,
    reserve: Reserve = NO_RESERVE,
    vary: str,
    run_id: str,
    extra: dict[str, Any] | None = None,
) -> Record:
    """The search's answer as a record: the largest fit's record (its measurements describe what
    fits), re-labelled, with the ``max_size`` dict; "oom" when nothing fits (the smallest size
    was measured over the budget: a search only gets here when every probe answered)."""
    source = largest or smallest_fail or probes[0]
    info = {
        "vary": vary,
        **_judged_by(base, budget, reserve),
        "largest_fit": largest.summary() if largest else None,
        "smallest_fail": smallest_fail.summary() if smallest_fail else None,
        "probes": len(probes),
        **(extra or {}),
    }
    if extra:
        info["resolution"] = bracket(info)
    if largest is None and smallest_fail is not None and vary == "params":
        # the axis starts where it starts (a family's smallest shape): a named preset below it
        # was never probed, so "nothing fits" is said of the sizes searched, with what lies below
        info["smaller_presets"] = smaller_presets(base.workload, smallest_fail.record.params)
    status = "ok" if largest else "oom"
    error = None
    if not largest:
        within = f"{size_text(budget)} with its reserve" if reserve.counted else size_text(budget)
        error = f"nothing fits in {within}: {first_sentence(source.record.error) or 'over budget'}"
    return replace(
        source.record,
        suite="max-size",
        status=status,
        error=error,
        max_size=info,
        note=answer_line_from(info, base),
        run_id=run_id,
    )


def smaller_presets(workload: str, params: int | None) -> dict[str, int]:
    """The workload's named presets with fewer parameters than ``params``, smallest first (none
    where their counts cannot be read)."""
    from shardbench.models.registry import preset_param_counts

    try:
        counts = preset_param_counts(workload)
    except Exception:  # noqa: BLE001 - a hint only: a workload of one's own may not list its presets
        return {}
    return dict(sorted(((p, n) for p, n in counts.items() if params and n < params), key=lambda pn: pn[1]))


def _judged_by(base: CellConfig, budget: int, reserve: Reserve) -> dict[str, Any]:
    """How a search decided its fits, as its record keeps it: enough to judge a peak again
    (``Reserve(fixed_bytes, ratio).fits(peak, budget_bytes)``) or to run the search again."""
    enforced = fits_by(base) == "cuda memory fraction"
    return {
        "budget_bytes": budget,
        "reserve": reserve.as_dict(),
        "usable_bytes": reserve.usable(budget),
        "fits_by": fits_by(base),
        "allocator_cap_bytes": allocator_cap(budget, reserve) if enforced else None,
    }


def kept_reserve(info: dict[str, Any]) -> Reserve:
    """The reserve a search's record says it counted (none in a record from before it was kept)."""
    kept = info.get("reserve") or {}
    return Reserve(kept.get("fixed_bytes", 0), kept.get("ratio", 1.0), kept.get("basis", ""))


def bracket(info: dict[str, Any]) -> float | None:
    """How far apart in parameters the largest fit and the smallest non-fit are (0.03: 3%)."""
    fit, fail = info.get("largest_fit"), info.get("smallest_fail")
    if info.get("vary") != "params" or not fit or not fail:
        return None
    return fail["params"] / fit["params"] - 1


def _what(p: dict[str, Any], vary: str, params: str) -> str:
    return f"batch {p['batch_size']}" if vary == "batch" else f"{p['preset']} ({params} params)"


def _line(i: int, cell: CellConfig, p: Probe, budget: int) -> str:
    r = p.record
    what = f"{r.workload}/{r.preset} ({params_text(r.params)} params) b={r.batch_size_per_rank}"
    verdict = "fits" if p.fits else ("does not fit" if r.status == "ok" else f"does not fit ({r.status})")
    if p.peak is None:
        against = f"{first_sentence(r.error)} vs budget {size_text(budget)}"
    elif p.reserve.counted:  # the peak and its reserve together against the budget, as plan does
        total, budget_text = apart(size_text, p.peak + (p.reserve_bytes or 0), budget)
        against = (
            f"peak {size_text(p.peak)} + reserve {size_text(p.reserve_bytes)} = {total} "
            f"vs budget {budget_text}"
        )
    else:
        peak_text, budget_text = apart(size_text, p.peak, budget)
        against = f"peak {peak_text} vs budget {budget_text}"
    return with_slow_start(
        f"[probe {i}] {what} {cell.strategy} N={r.world_size}: {verdict} - {against} ({r.wall_s or 0:.0f}s)",
        r,
    )


def _head(info: dict[str, Any], cell: CellConfig) -> str:
    """What was searched, and within what: the budget and, where one is counted, the reserve."""
    budget = size_text(info["budget_bytes"])
    head = f"max-size {cell.workload} {cell.strategy} N={cell.world_size} budget {budget}"
    reserve = kept_reserve(info)
    if reserve.counted:
        head += f", counting plan's reserve beside each peak ({reserve.basis})"
    return head


def answer_line_from(info: dict[str, Any], cell: CellConfig) -> str:
    vary = info["vary"]
    fit, fail = info["largest_fit"], info["smallest_fail"]
    head = _head(info, cell)
    # the bracket's two ends never read equal when they differ (0.5M and 0.5M params)
    fit_params, fail_params = apart(params_text, (fit or {}).get("params"), (fail or {}).get("params"))
    fit_peak, fail_peak = apart(size_text, (fit or {}).get("peak_bytes"), (fail or {}).get("peak_bytes"))
    counted = kept_reserve(info).counted

    def beside(p: dict[str, Any]) -> str:
        kept = p.get("reserve_bytes")
        return f" + reserve {size_text(kept)}" if counted and kept is not None else ""

    got = (
        f"largest fit: {_what(fit, vary, fit_params)}, peak {fit_peak}{beside(fit)}"
        if fit
        else "nothing fits"
    )
    if fail:
        why = "" if fail["status"] == "ok" else f" [{fail['status']}]"
        what = _what(fail, vary, fail_params)
    if fail and not fit and vary == "params":
        # the search's smallest size, not the smallest model: a smaller one may well fit
        lost = f"{what} is the smallest size the search covers, peak {fail_peak}{beside(fail)}{why}"
        smaller = info.get("smaller_presets") or {}
        if smaller:
            named = ", ".join(f"{p} ({params_text(n)} params)" for p, n in smaller.items())
            lost += f"; a smaller model may fit: {named} (--ladder {','.join([*smaller, fail['preset']])})"
        else:
            lost += "; a smaller model may fit (--ladder searches the presets it names)"
    elif fail:
        lost = f"smallest that did not fit: {what}, peak {fail_peak}{beside(fail)}{why}"
    else:
        lost = "everything probed fits"
    gap, target = bracket(info), info.get("target_resolution")
    if gap is not None and target is not None:
        coarse = f", the sizes have nothing between them (target {target:.0%})" if gap > target else ""
        lost += f" ({gap:.1%} apart{coarse})"
    return f"{head}: {got}; {lost}"
