"""``shardbench claim``: does sharding halve per-rank memory or double the trainable model?

For each workload of a ``ClaimSpec`` (bench/studies/claim_specs.py) it measures, at equal per-rank batch:

* per-rank peak memory of ddp, zero2, our further stages (zero3) and the peers at a simulated
  world size N (real memory);
* the largest trainable model of ddp, zero2 and zero3 within the same per-rank budget (max-size search;
  probes under ``--fake`` where the workload allows it, since planning equals a real run within
  1% per category (tests/test_fake.py), real allocations otherwise), each peak with the reserve
  ``plan`` keeps beside it (none on the CPU, the allocator's cache on CUDA);
* the step time of ddp, zero2 and the further stages on real ranks where the machine has them,
  else the simulated runs' compute-only time, labelled: what sharding costs in throughput, set
  beside what it saves in memory (``WorkloadResult.cost_line``).

The verdict is a measurement: the claim holds for a workload when zero2's peak is at most 0.5x
DDP's or its largest trainable model is at least 2x DDP's; when it does not, the report says what
the peak is made of (typically activations, which no ZeRO stage shards).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from shardbench.harness.config import CellConfig, make_cell
from shardbench.harness.launch import JobCells, run_cell
from shardbench.harness.result import with_slow_start
from shardbench.models.registry import get_workload
from shardbench.records import Record, append_record, read_records
from shardbench.studies.claim_result import (
    BASELINE,
    OURS,
    WorkloadResult,
    every_variant,
    results_from_records,
)
from shardbench.studies.claim_specs import ClaimSpec, ClaimWorkload
from shardbench.studies.maxsize import parse_budget, search
from shardbench.studies.plan_reserve import policy
from shardbench.wording import print_wrapped


def run_claim(
    spec: ClaimSpec,
    *,
    out_dir: Path,
    run_id: str,
    workloads: tuple[str, ...] | None = None,
    progress: Callable[[str], None] = print_wrapped,
    measured: dict[str, WorkloadResult] | None = None,
    job_cells: JobCells | None = None,
) -> list[WorkloadResult]:
    """Measure every workload of ``spec``; records go to ``out_dir/records.jsonl`` as they come.
    ``measured`` (``claim --resume``): results by variant label whose ok cells are kept, not
    measured again. ``job_cells``: inside a torchrun or Slurm job, what runs each cell on the
    job's processes."""
    claim = _ClaimCells(spec, out_dir, run_id, progress, job_cells)
    results = []
    for w in spec.variants():
        if workloads and w.name not in workloads:
            continue
        have = (measured or {}).get(w.label) or WorkloadResult(w)
        results.append(claim.measure(w, have))
    return results


class _ClaimCells:
    """The cells of one claim: each workload's memory, timing and max-size cells, measured
    unless a kept record of the same cell is ok."""

    def __init__(self, spec: ClaimSpec, out_dir: Path, run_id: str, progress: Callable[[str], None],
                 job_cells: JobCells | None = None) -> None:  # fmt: skip
        self.spec, self.out_dir, self.run_id, self.progress = spec, out_dir, run_id, progress
        self.job_cells = job_cells
        self.budget = parse_budget(spec.budget)
        self.reserves = policy(spec.device, fixed=spec.reserve_bytes)  # plan's: a fit means the same

    def base(self, w: ClaimWorkload) -> CellConfig:
        spec = self.spec
        return make_cell(
            workload=w.name,
            preset=w.preset,
            strategy=BASELINE,
            world_size=spec.world_size,
            batch_size=w.batch_size,
            # memory cells: one timed step (after warm-up) is enough, unless they are also the
            # step-time cells (no real ranks: timing_world_size 0)
            steps=1 if spec.timing_world_size else spec.steps,
            warmup=spec.warmup,
            device=spec.device,
            precision=spec.precision,
            suite=f"claim-{spec.name}",
            simulate=True,
            activation_checkpointing=w.activation_checkpointing,
        )

    def record(self, cell: CellConfig, kept: dict[str, Record]) -> Record:
        if (r := kept.get(cell.strategy)) is not None and r.status == "ok":
            return r
        r = (self.job_cells or run_cell)(cell, run_id=self.run_id)
        append_record(self.out_dir / "records.jsonl", r)
        label = f"{cell.workload}/{cell.preset} {cell.strategy} N={r.world_size}"
        self.progress(with_slow_start(f"{label}: {r.status} ({r.wall_s:.0f}s)", r))
        return r

    def measure(self, w: ClaimWorkload, have: WorkloadResult) -> WorkloadResult:
        spec, base, res = self.spec, self.base(w), WorkloadResult(w)
        stages = (BASELINE, OURS, *spec.further)
        for s in (*stages, *spec.peers):
            res.memory[s] = self.record(replace(base, strategy=s), have.memory)
        if spec.timing_world_size:
            for s in stages:  # what each stage costs in throughput
                real = replace(base, strategy=s, world_size=spec.timing_world_size, simulate=False)
                res.timing[s] = self.record(replace(real, steps=spec.steps, track_memory=False), have.timing)
        else:
            res.timing = {s: res.memory[s] for s in stages}
        if spec.real_peers and spec.timing_world_size:
            for s in (BASELINE, OURS, *spec.real_peers):
                real = replace(base, strategy=s, world_size=spec.timing_world_size, simulate=False, steps=1)
                res.real_memory[s] = self.record(real, have.real_memory)
        for s in stages:
            res.max_size[s] = self.largest(w, base, s, res, have)
        return res

    def largest(
        self, w: ClaimWorkload, base: CellConfig, s: str, res: WorkloadResult, have: WorkloadResult
    ) -> Record:
        """The max-size search of strategy ``s`` (kept if a kept one is ok)."""
        if (kept := have.max_size.get(s)) is not None and kept.status == "ok":
            return kept
        plannable = not get_workload(w.name).not_plannable and self.spec.device == "cpu"
        return search(
            replace(base, strategy=s, fake=plannable, steps=1),
            known={w.preset: res.memory[s]},
            budget=self.budget,
            reserve=self.reserves.of(s),
            vary="params",
            ladder=w.ladder,
            out_dir=self.out_dir,
            run_id=self.run_id,
            progress=self.progress,
            job_cells=self.job_cells,
        )


@dataclass(frozen=True)
class ClaimRun:
    results: list[WorkloadResult]
    wall_s: float
    resumed: bool  # completed a claim stopped part-way: its kept cells are not in ``wall_s``


def claim(
    spec: ClaimSpec,
    *,
    out_dir: Path,
    workloads: tuple[str, ...] | None = None,
    resume: bool = False,
    job_cells: JobCells | None = None,
) -> ClaimRun:
    """Run the claim into ``out_dir`` (records as they come) and return its per-workload
    results. With ``resume``, the directory's ok cells are kept and only the others measured (a
    claim stopped part-way, or a spec that gained a strategy); the results then cover every
    variant. ``job_cells``: inside a torchrun or Slurm job, what runs each cell on its processes."""
    start = time.perf_counter()
    run_id = time.strftime("%Y%m%d-%H%M%S") + f"-claim-{spec.name}"
    out_dir.mkdir(parents=True, exist_ok=True)
    old = out_dir / "records.jsonl"
    measured = None
    if resume and old.exists():
        measured = {r.workload.label: r for r in results_from_records(spec, read_records([old]))}
    elif old.exists():  # a report describes one claim run; the previous one is kept aside, not lost
        old.rename(
            out_dir / f"records.{time.strftime('%Y%m%d-%H%M%S', time.localtime(old.stat().st_mtime))}.bak"
        )
    results = run_claim(
        spec, out_dir=out_dir, run_id=run_id, workloads=workloads, measured=measured, job_cells=job_cells
    )
    if measured:
        ran = {r.workload.label: r for r in results}
        results = every_variant(spec, {**measured, **ran})
    return ClaimRun(results, time.perf_counter() - start, resumed=bool(measured))
