"""Start a world of N ranks for one cell and turn their results into a record.

Each rank is a fresh ``python -m bench.harness.worker`` process, wired up with the same environment
variables torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR, ...), so the worker runs unchanged under
torchrun for multi-node jobs. Fresh processes also isolate cells: a crash, an OOM or a leaked
allocation in one cell cannot affect the next.

Every wait is bounded: the cell's timeout caps the whole world, and once one rank has failed the
others get a short grace period (they are probably blocked in a collective with the dead rank)
before they are killed. The failed rank's traceback goes into the record.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness.config import CellConfig
from bench.harness.records import Record, capture_env, first_line
from bench.harness.worker import threads_per_rank
from bench.metrics.analytic import Sharding, predicted_model_state_bytes
from bench.metrics.timing import slowest_rank, summarize
from bench.strategies.base import WorldPlan
from bench.strategies.registry import canonical_name, get_strategy

PROJECT_ROOT = Path(__file__).resolve().parent.parent
FAILED_RANK_GRACE_S = 5.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def run_cell(cell: CellConfig, *, run_id: str) -> Record:
    """Run one cell in fresh processes and return its record (never raises for a failed cell)."""
    strategy = get_strategy(cell.strategy)
    plan = strategy.plan_world(cell.world_size, cell.device, cell.simulate)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="shardbench-cell-") as tmp:
        tmpdir = Path(tmp)
        cell_file = tmpdir / "cell.json"
        cell_file.write_text(json.dumps(cell.to_json()))
        port = _free_port()
        procs: list[subprocess.Popen[bytes]] = []
        for rank in range(plan.processes):
            env = dict(os.environ)
            threads = str(threads_per_rank(plan.processes))
            env.update(
                RANK=str(rank),
                WORLD_SIZE=str(plan.processes),
                LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(plan.processes),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                OMP_NUM_THREADS=threads,
                MKL_NUM_THREADS=threads,
                PYTHONPATH=os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")])),
            )
            log = (tmpdir / f"rank{rank}.log").open("wb")
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "bench.harness.worker",
                        "--cell",
                        str(cell_file),
                        "--result-dir",
                        str(tmpdir),
                    ],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=PROJECT_ROOT,
                )
            )
        timed_out = _wait(procs, cell.timeout_s)
        results = []
        for rank, proc in enumerate(procs):
            result_file = tmpdir / f"rank{rank}.json"
            if result_file.exists():
                results.append(json.loads(result_file.read_text()))
            elif timed_out:
                results.append(
                    {
                        "rank": rank,
                        "status": "timeout",
                        "error": f"rank {rank}: no result within {cell.timeout_s:.0f}s",
                    }
                )
            else:
                results.append(
                    {
                        "rank": rank,
                        "status": "error",
                        "error": f"rank {rank}: exited with code {proc.returncode} and no "
                        f"result; its output ends:\n{_tail(tmpdir / f'rank{rank}.log')}",
                    }
                )
    return build_record(
        cell, plan, results, run_id=run_id, wall_s=time.perf_counter() - start, processes=plan.processes
    )


def _wait(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> bool:
    """Wait for all ranks; kill the rest after a rank fails or the deadline passes.
    Returns True when the deadline passed."""
    deadline = time.monotonic() + timeout_s
    failed_at: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return False
        now = time.monotonic()
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = now
        if now > deadline or (failed_at is not None and now - failed_at > FAILED_RANK_GRACE_S):
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            return now > deadline
        time.sleep(0.05)


def _failure(results: list[dict[str, Any]]) -> tuple[str, str] | None:
    """The status and error of the cell if any rank failed. The root cause is the rank that
    failed first: the others usually fail *because* of it (connection closed by peer, a
    collective timing out), so their errors follow as one line each."""
    bad = [r for r in results if r.get("status") != "ok"]
    if not bad:
        return None
    raised = [r for r in bad if "failed_at" in r]
    first = min(raised, key=lambda r: r["failed_at"]) if raised else bad[0]
    others = [f"  {first_line(r.get('error'), 200)}" for r in bad if r is not first]
    error = first.get("error") or ""
    if others:
        error += "\nother ranks:\n" + "\n".join(others)
    return first["status"], error


def build_record(
    cell: CellConfig,
    plan: WorldPlan,
    results: list[dict[str, Any]],
    *,
    run_id: str,
    wall_s: float,
    processes: int,
) -> Record:
    """Assemble the cell's record from every rank's result."""
    strategy = get_strategy(cell.strategy)
    results = sorted(results, key=lambda r: r["rank"])
    world_size = plan.world_size if processes == plan.processes else processes
    failure = _failure(results)
    ok = [r for r in results if r.get("status") == "ok"]
    num_params = ok[0]["num_params"] if ok else get_workload_params(cell)
    predicted = predict(cell, world_size, num_params)
    record = Record(
        run_id=run_id,
        suite=cell.suite,
        workload=cell.workload,
        preset=cell.preset,
        params=num_params,
        strategy=canonical_name(cell.strategy),
        world_size=world_size,
        requested_world_size=cell.world_size,
        simulated=plan.simulated,
        fake=cell.fake,
        backend=(
            "fake"
            if plan.simulated
            else "none"
            if not strategy.needs_process_group
            else "nccl"
            if cell.device == "cuda"
            else "gloo"
        ),
        device=cell.device,
        precision=cell.precision,
        batch_size_per_rank=cell.batch_size,
        steps=cell.steps,
        warmup=cell.warmup,
        status="ok",
        note=_note(cell, plan, ok),
        strategy_settings=ok[0]["settings"] if ok else strategy.settings(),
        predicted_mem_bytes=predicted,
        wall_s=wall_s,
        env=capture_env(cell.device),
    )
    if failure is not None:
        record.status, record.error = failure
        return record
    times = summarize(slowest_rank([r["step_times"] for r in results]))
    record.step_time_s = times
    if times and times["median"] > 0 and not plan.simulated:  # simulated: no communication timed
        record.samples_per_s = cell.batch_size * world_size / times["median"]
    allocators = [r.get("cuda_allocator") for r in results]
    if all(a is not None for a in allocators) and not cell.fake:
        per_rank = [a["max_allocated"] for a in allocators]  # type: ignore[index]
        source = "cuda max_memory_allocated"
    else:
        per_rank = [r["tracked_peak"] for r in results]
        source = "tracked tensors (MemTracker" + (", FakeTensorMode)" if cell.fake else ")")
    if any(p is None for p in per_rank):  # a timing-only cell (track_memory off) on CPU
        losses = results[0]["losses"]
        record.loss = {"first": losses[0], "last": losses[-1]} if losses else None
        return record
    peak_rank = max(range(len(results)), key=lambda i: per_rank[i])
    record.peak_mem_bytes = {
        "per_rank": per_rank,
        "max": per_rank[peak_rank],
        "source": source,
        "tracked_per_rank": [r["tracked_peak"] for r in results],
    }
    record.mem_breakdown_bytes = results[peak_rank]["breakdown"]
    record.model_state_bytes = results[peak_rank].get("model_state")
    record.cuda_allocator = allocators[peak_rank]
    losses = results[0]["losses"]
    record.loss = {"first": losses[0], "last": losses[-1]} if losses else None
    return record


FAKE_NOTE = "fake: planned under FakeTensorMode, nothing allocated, no step time"


def _note(cell: CellConfig, plan: WorldPlan, ok: list[dict[str, Any]]) -> str:
    parts = [plan.note]
    if cell.fake:
        parts.append(FAKE_NOTE)
        planned = ok[0]["settings"].get("planned") if ok else None
        if planned:
            parts.append(planned)
    return "; ".join(p for p in parts if p)


def predict(cell: CellConfig, world_size: int, num_params: int) -> dict[str, int]:
    """The analytic model-state bytes per rank for this cell (bench/metrics/analytic.py)."""
    strategy = get_strategy(cell.strategy)
    sharding: Sharding = strategy.sharding
    group_sizes = None
    if sharding.whole_parameters:
        from models.registry import get_workload

        group_sizes = get_workload(cell.workload).param_group_sizes(cell.preset)
    precision = strategy.model_state_precision(cell.precision)
    return predicted_model_state_bytes(num_params, world_size, precision, sharding, group_sizes)


def get_workload_params(cell: CellConfig) -> int:
    from models.registry import get_workload

    return get_workload(cell.workload).param_count(cell.preset)
