"""Cells for tests: ``tiny_cell()`` builds one, ``run_cell_here()`` runs one without fresh
processes.

``shardbench.harness.launch.run_cell`` starts every rank as a fresh process (forked from a warm server
on the CPU, still about a second a cell plus the server's first start), which the tests of the
launcher itself need (``test_run_end_to_end``, ``test_claim``, ``test_maxsize``). Tests of what a
rank measures need only the rank: ``run_cell_here`` runs the worker's ``run_rank`` as rank 0 of a
fake world in this process for a simulated cell, or on the session's shared gloo world
(``tests.dist.run_in_world``) for a real one, and assembles the record with the launcher's own
``build_record``: the same record ``run_cell`` returns, wall time aside.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from shardbench.harness.config import CellConfig
from shardbench.harness.counting import StepCounts
from shardbench.records import Record

#: the tiny transformer, two ranks, a few steps: small enough for a test
TINY_CELL: dict[str, Any] = dict(
    workload="transformer", preset="tiny", strategy="ddp", world_size=2, batch_size=2, steps=2, warmup=1
)


def tiny_cell(**overrides: Any) -> CellConfig:
    """A ``CellConfig`` for the tiny transformer; ``overrides`` replace any field."""
    return CellConfig(**{**TINY_CELL, **overrides})


#: the step counts this process made (``harness.counting``): one session's code, so a model's step
#: counted once serves every later cell of it here, as a run's counts serve its later cells
SHARED_COUNTS = StepCounts()


def _world_rank(rank: int, world_size: int, cell: CellConfig, reported_world_size: int) -> Any:
    from shardbench.harness.worker import run_rank

    # run_rank, not run_rank_safely: a rank that fails raises, so the world is ended at once
    # instead of its other ranks waiting in a collective until the timeout
    return run_rank(
        cell,
        rank=rank,
        world_size=reported_world_size,
        processes=world_size,
        local_rank=rank,
        local_world_size=world_size,
        counts=SHARED_COUNTS,
    )


def run_cell_here(cell: CellConfig, *, run_id: str = "t") -> Record:
    """What ``run_cell(cell, run_id=run_id)`` records, run in this process (simulated or
    single-process cells) or on the shared gloo world of the cell's size (see the module doc)."""
    from shardbench.harness.result import build_record
    from shardbench.harness.worker import run_rank_safely
    from tests.dist import run_in_world

    plan = cell.world_plan()
    start = time.perf_counter()
    if plan.processes == 1:
        assert not dist.is_initialized(), "a process group is already initialised in this process"
        threads = torch.get_num_threads()
        try:
            # local_world_size=2: one thread, as everywhere in the tests (conftest.py). run_rank
            # gives a rank alone on a 2-core host two threads, which is several times slower when
            # other processes use the cores too (measured: a simulated swav tiny cell, 96 s with
            # two threads on a loaded machine, 14 s with one)
            results = [
                run_rank_safely(
                    cell,
                    rank=0,
                    world_size=plan.world_size,
                    processes=1,
                    local_rank=0,
                    local_world_size=2,
                    counts=SHARED_COUNTS,
                )
            ]
        finally:
            torch.set_num_threads(threads)  # run_rank sets the threads of a rank alone on the host
            if dist.is_initialized():  # the fake world a simulated cell joined
                dist.destroy_process_group()
    else:
        results = run_in_world(_world_rank, plan.processes, cell, plan.world_size, timeout_s=cell.timeout_s)
    return build_record(
        cell, plan, results, run_id=run_id, wall_s=time.perf_counter() - start, processes=plan.processes
    )


def measured_once() -> Any:
    """A ``run_cell`` stand-in that runs each distinct cell here once (``run_cell_here``) and
    returns the same record when asked again: a test measures some cells first to choose a
    budget, then the code under test asks for them again."""
    measured: dict[CellConfig, Record] = {}

    def run_once(cell: CellConfig, *, run_id: str) -> Record:
        if cell not in measured:
            measured[cell] = run_cell_here(cell, run_id=run_id)
        return replace(measured[cell], run_id=run_id)  # the run asking: its own records

    return run_once


def stand_in_record(cell: CellConfig, *, run_id: str = "t") -> Record:
    """What ``run_cell`` would record for ``cell`` if its peak were 16 bytes per parameter (its
    parameters alone), without running anything: for tests of what is decided from records."""
    from shardbench.harness.result import RankResult, build_record
    from shardbench.models.registry import get_workload
    from shardbench.strategies.registry import get_strategy

    params = get_workload(cell.workload).param_count(cell.preset)
    result = RankResult(rank=0, num_params=params, step_times=[1.0], losses=[1.0],
                        tracked_peak=16 * params, breakdown={"params": 16 * params})  # fmt: skip
    plan = get_strategy(cell.strategy).plan_world(cell.world_size, "cpu", True)
    return build_record(cell, plan, [result], run_id=run_id, wall_s=0.0, processes=1)
