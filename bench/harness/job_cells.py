"""Cells inside a torchrun or Slurm job: rank 0 leads, every other process of the job follows.

Every process of the job runs the same command. Rank 0 runs it as on one machine (a suite,
nightly's gate, max-size's probes, a claim: the records, tables, report and verdict are its
own) with one change: a cell of N > 1 processes goes to the job (``Leader.run_cell``, handed to
the command as its ``job_cells``). Rank 0 posts the cell in the job's store; each of the job's first
N processes starts one fresh rank process for it, exactly as the local launcher starts each of
its ranks (``launch.RankWorld``: the same worker, the same phases, the same deadline and
stack dump), and the N ranks meet in a key prefix of the job's store used for this cell alone,
so nothing a failed cell left there is read by the next. The other processes wait for the next
cell. Each process sends its rank's result back through the store, and rank 0 assembles the
record with the launcher's ``build_record``: the same record, byte for byte, as on one machine.
A cell of one process (simulated, fake, dp) runs on rank 0 alone, with the local launcher.

A failure stays the size of its cell: a rank that fails marks the cell failed, the other
processes stop their ranks after the launcher's grace period, and the record blames the rank
that failed first. A process of the job that is gone (its heartbeat stood still, or its result
never came) ends the job: its cell is recorded with that rank blamed, rank 0 stops the run
(``launch.CellEndsRun``; the records so far are kept and ``--resume`` continues in a new job),
and the others stop when rank 0 says so or, if rank 0 is the one gone, when its heartbeat stops.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardbench import core_binding
from shardbench.harness.config import CellConfig, threads_per_rank
from shardbench.harness.job import STORE_PREFIX
from shardbench.harness.job_link import SILENT_S, JobError, JobLink
from shardbench.harness.launch import POLL_S, CellEndsRun, RankWorld, kept_counts, launcher_dir
from shardbench.harness.launch import run_cell as run_here
from shardbench.harness.resolved_cell import ResolvedCell
from shardbench.harness.result import RankResult, build_record
from shardbench.records import Record
from shardbench.strategies.catalog import WorldPlan
from shardbench.wording import count

#: rank 0 waits this long past a cell's timeout for another process's result (one whose
#: heartbeat goes on): the time that process takes to notice the cell, dump its rank's stack
#: and stop it
RESULT_MARGIN_S = 30.0
#: how long rank 0 waits at the end for every process to have read that the command is over
#: (under Slurm rank 0 hosts the store: leaving first would look like a crash to the others)
FAREWELL_S = 30.0


def _key(seq: int, name: str) -> str:
    return f"cell{seq}/{name}"


def rank_places(link: JobLink, seq: int, processes: int, cell: CellConfig) -> dict[str, str]:
    """The variables this process's rank of cell ``seq`` gets: its place in the cell's world of
    ``processes`` (the job's first ones), the device it drives, its cores shared among the
    cell's ranks that run on them (``LOCAL_WORLD_SIZE``: the ranks of its node, or only itself
    where srun bound each task to cores of its own), a CPU rank's own block of those cores to
    bind to (``core_binding``, as a local run's ranks), and where in the job's store the ranks
    meet."""
    job = link.job
    here = link.sharing_cores(job.rank, range(processes))
    threads = str(threads_per_rank(here))
    cores = link.own_cores(job.rank, range(processes)) if cell.device == "cpu" else None
    return dict(
        RANK=str(job.rank),
        WORLD_SIZE=str(processes),
        LOCAL_RANK=str(job.local_rank),
        LOCAL_WORLD_SIZE=str(here),
        MASTER_ADDR=job.master_addr,
        MASTER_PORT=str(job.master_port),
        OMP_NUM_THREADS=threads,
        MKL_NUM_THREADS=threads,
        **{STORE_PREFIX: link.prefix + _key(seq, "world/")},
        **core_binding.as_variable(cores),
    )


def run_own_rank(link: JobLink, seq: int, cell: CellConfig, processes: int) -> RankResult:
    """Start, watch and stop this process's rank of cell ``seq``; its result. A failure here
    marks the cell failed in the store, so the other processes stop theirs after the grace
    period; a failure there stops this one. Raises only what comes from outside (an interrupt),
    after marking the cell failed too."""
    rank, failed = link.job.rank, _key(seq, "failed")
    # the counts of the job's earlier cells, for the job's command only
    counted = kept_counts(f"job {link.prefix}")
    with counted as counts, tempfile.TemporaryDirectory(prefix="cell-", dir=launcher_dir()) as tmp:
        try:
            places = {rank: rank_places(link, seq, processes, cell)}
            world = RankWorld(cell, processes, Path(tmp), places, counts)
            try:
                timed_out = world.wait(cell.timeout_s, peer_failed=lambda: link.has(failed))
                if world.failed() and not link.has(failed):
                    link.set(failed, str(rank))
                if timed_out:
                    world.dump_stacks()
            finally:
                world.stop()
        except BaseException:
            link.set(failed, str(rank))
            raise
        [result] = world.results(timed_out)
    return result


@dataclass
class Leader:
    """Rank 0's side: posts each cell and each end, gathers the results."""

    link: JobLink
    #: messages posted so far (every process reads them all, in order)
    posted: int = 0
    #: cells sent to the job so far: each one's key prefix is its own
    cells: int = 0
    lost: list[int] = field(default_factory=list)

    def post(self, message: dict[str, Any]) -> None:
        self.link.set(f"msg/{self.posted}", json.dumps(message))
        self.posted += 1

    def run_cell(self, cell: CellConfig, *, run_id: str) -> Record:
        """The record of ``cell``: run on the job's first N processes, or here by the local
        launcher when it has one process (simulated, fake, dp), which needs no other host."""
        resolved = ResolvedCell.of(cell)
        if (plan := resolved.world_plan()).processes > 1:
            return self._on_job(resolved, plan, run_id=run_id)
        return run_here(cell, run_id=run_id)

    def _on_job(self, resolved: ResolvedCell, plan: WorldPlan, *, run_id: str) -> Record:
        cell, start = resolved.cell, time.perf_counter()
        seq, world = self.cells, self.link.job.world_size
        self.cells += 1
        if plan.processes > world:  # (validation refuses such a cell; a stand-in for a bug)
            error = (
                f"the cell needs {count(plan.processes, 'process', 'processes')} and the "
                f"{self.link.job.describe()} has {world}"
            )
            results = [
                RankResult(rank=r, status="error", error=f"rank {r}: {error}") for r in range(plan.processes)
            ]
            return build_record(resolved, plan, results, run_id=run_id, wall_s=0.0, processes=plan.processes)
        self.post({"cell": cell.to_json(), "seq": seq, "processes": plan.processes})
        deadline = time.monotonic() + cell.timeout_s + RESULT_MARGIN_S
        own = run_own_rank(self.link, seq, cell, plan.processes)
        others, lost = self._gather(seq, plan.processes, deadline=deadline)
        wall_s = time.perf_counter() - start
        record = build_record(
            resolved, plan, [own, *others], run_id=run_id, wall_s=wall_s, processes=plan.processes
        )
        if lost:
            self.lost = lost
            names = ", ".join(f"rank {r} ({self.link.host(r)})" for r in lost)
            raise CellEndsRun(f"the job lost {names}; no cell can run after this one", record)
        return record

    def _gather(self, seq: int, processes: int, *, deadline: float) -> tuple[list[RankResult], list[int]]:
        """Every other rank's result of cell ``seq``: each sent by its process once it stopped
        its rank (before ``deadline``: the cell's timeout and a margin), or, from a process that
        is gone (silent) or never sent it, a result that blames that rank."""
        waiting, results, lost = set(range(1, processes)), [], []
        while waiting:
            for r in sorted(waiting):
                if self.link.has(_key(seq, f"result/{r}")):
                    results.append(RankResult.from_json(self.link.get_json(_key(seq, f"result/{r}"))))
                    waiting.discard(r)
                elif self.link.silent_for(r) > SILENT_S or time.monotonic() > deadline:
                    results.append(self._lost_result(r))
                    lost.append(r)
                    waiting.discard(r)
            if waiting:
                time.sleep(POLL_S)
        return results, lost

    def _lost_result(self, rank: int) -> RankResult:
        return RankResult(
            rank=rank,
            status="error",
            error=f"rank {rank}: its process of the job (on {self.link.host(rank)}) sent no result "
            "and has stopped answering: it died or its node was lost",
            failed_at=time.time(),
            vanished=True,
        )

    def finish(self, code: int | None) -> None:
        """Tell every process the command is over (with rank 0's exit code), and wait, bounded,
        until each has read it."""
        byes = [f"bye/{r}" for r in range(1, self.link.job.world_size) if r not in self.lost]
        deadline = time.monotonic() + FAREWELL_S
        try:
            self.post({"done": code})
            while not all(self.link.has(k) for k in byes) and time.monotonic() < deadline:
                time.sleep(POLL_S)
        except JobError:  # the store is gone: there is no one left to tell
            pass


def follow(link: JobLink) -> int:
    """A process of rank > 0: run its rank of each cell rank 0 posts, until rank 0 says the
    command is over; its exit code is rank 0's. Raises ``JobError`` when rank 0 is gone."""
    rank = link.job.rank
    for n in range(sys.maxsize):
        message = _next_message(link, n)
        if "done" in message:
            link.close()  # no heartbeat after the goodbye: rank 0 (and the store) may be gone then
            link.set(f"bye/{rank}", "1")
            return 1 if message["done"] is None else int(message["done"])
        seq, processes = message["seq"], message["processes"]
        if rank < processes:
            cell = CellConfig.from_json(message["cell"])
            try:
                result = run_own_rank(link, seq, cell, processes)
            except JobError:
                raise
            except Exception as e:  # noqa: BLE001 - this rank's failure is the cell's, not the job's
                error = f"rank {rank}: {type(e).__name__}: {e}"
                result = RankResult(rank=rank, status="error", error=error, failed_at=time.time())
            link.set(_key(seq, f"result/{rank}"), json.dumps(result.to_json()))
    raise AssertionError("unreachable")


def _next_message(link: JobLink, n: int) -> dict[str, Any]:
    key = f"msg/{n}"
    while not link.has(key):
        if link.silent_for(0) > SILENT_S:
            raise JobError(
                f"rank 0 of the {link.job.describe()} (on {link.host(0)}) has been silent for "
                f"{SILENT_S:g}s: it is gone"
            )
        time.sleep(POLL_S)
    return link.get_json(key)
