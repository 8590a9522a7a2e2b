"""Each CPU rank the launcher starts is bound to cores of its own (``core_binding``): the blocks,
the launcher's variables, the rank's own binding, the probes' copies, and the switch."""

from __future__ import annotations

import multiprocessing
import os
import threading
from types import SimpleNamespace

import pytest

from shardbench import core_binding
from shardbench.core_binding import RANK_CORES, SWITCH, binding_key, cores_each, cores_of
from shardbench.harness.job_link import JobLink
from shardbench.harness.launch import local_places
from shardbench.harness.validate import plan_cells
from shardbench.prediction.at_once import at_once
from shardbench.studies.machines import env_changes, machines, rank_binding
from tests.cells import tiny_cell

affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="the OS has no CPU affinity call")


def test_equal_disjoint_blocks_and_round_robin_past_the_cores() -> None:
    eight = range(8)
    assert [cores_of(i, 2, eight) for i in range(2)] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert [cores_of(i, 3, eight) for i in range(3)] == [(0, 1), (2, 3), (4, 5)]  # 2 left unused
    assert cores_of(0, 1, [5, 3]) == (3, 5)
    # more ranks than cores: each core holds as many ranks, none left to the scheduler
    assert [cores_of(i, 4, [2, 7]) for i in range(4)] == [(2,), (7,), (2,), (7,)]
    assert cores_each(2, eight) == 4 and cores_each(16, eight) == 1
    assert cores_of(0, 2, []) is None  # an OS that does not say


def test_the_switch_turns_binding_off_and_a_bad_value_is_refused_before_any_cell(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SWITCH, "0")
    assert cores_of(0, 2, [0, 1]) is None and cores_each(2, [0, 1]) == 0
    assert binding_key(2) == "unbound"
    assert RANK_CORES not in local_places(2, tiny_cell())[0]
    monkeypatch.setenv(SWITCH, "yes")
    with pytest.raises(ValueError, match=r"SHARDBENCH_BIND_CORES='yes': expected 1 .* or 0"):
        plan_cells([tiny_cell()])


@affinity
def test_the_launcher_hands_each_cpu_rank_its_block(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SWITCH, raising=False)
    own = core_binding.own_cpus()
    places = local_places(2, tiny_cell(world_size=2))
    assert [places[r].get(RANK_CORES) for r in range(2)] == [
        ",".join(map(str, cores_of(r, 2, own))) for r in range(2)
    ]
    # a simulated rank gets the block one rank of its world would
    simulated = local_places(1, tiny_cell(world_size=4, simulate=True))
    assert simulated[0][RANK_CORES] == ",".join(map(str, cores_of(0, 4, own)))
    # a CUDA rank is left as the host places it
    assert RANK_CORES not in local_places(2, tiny_cell(device="cuda"))[0]


def _bound_here(queue: multiprocessing.Queue, handed: str) -> None:
    os.environ[RANK_CORES] = handed
    queue.put((core_binding.bind_from_environment(), sorted(os.sched_getaffinity(0))))


@affinity
def test_a_rank_binds_itself_to_the_cores_it_was_handed() -> None:
    core = min(core_binding.own_cpus())
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_bound_here, args=(queue, str(core)))
    child.start()
    bound, affinity_now = queue.get(timeout=60)
    child.join(timeout=30)
    assert bound == (core,) and affinity_now == [core]


@affinity
def test_probe_copies_run_on_their_ranks_cores_and_leave_the_caller_as_it_was() -> None:
    own = core_binding.own_cpus()
    before = os.sched_getaffinity(0)

    def where(index: int, together: object) -> tuple[int, ...]:
        return tuple(sorted(os.sched_getaffinity(threading.get_native_id())))

    assert at_once(where, 2, 1) == [cores_of(i, 2, own) for i in range(2)]
    assert os.sched_getaffinity(0) == before


def test_bound_and_free_ranks_are_different_machines_to_compare() -> None:
    def record(placement: dict[str, int] | None, device: str = "cpu") -> SimpleNamespace:
        return SimpleNamespace(device=device, schema=4, env={"torch": "2.11.0"}, placement=placement)

    free = [record({"ranks": 2, "cores": 2}), record({"ranks": 1, "cores": 2})]  # a simulated cell too
    bound = [record({"ranks": 2, "cores": 2, "bound_cores_each": 1})]
    assert {rank_binding(r) for r in free} == {"free"} and rank_binding(bound[0]) == "bound"
    assert env_changes(free, bound) == {"rank_binding": (["free"], ["bound"])}
    assert len(machines(free)) == 1  # a run's cells, simulated ones included, are one machine
    # not compared where unknown: a record without placement, a GPU's
    assert rank_binding(record(None)) is None and rank_binding(record({"ranks": 2}, "cuda")) is None
    assert env_changes([record(None)], bound) == {}


def test_a_jobs_ranks_split_the_cpus_they_share_and_keep_cpus_of_their_own() -> None:
    link = JobLink.__new__(JobLink)  # the store is not what is tested: its ranks' CPUs and hosts
    link.host = lambda rank: "a" if rank < 4 else "b"
    # torchrun: the ranks of host a share its 4 CPUs; srun bound host b's ranks to one CPU each
    link.cpus = {0: {0, 1, 2, 3}, 1: {0, 1, 2, 3}, 2: {0, 1, 2, 3}, 3: {0, 1, 2, 3}, 4: {0}, 5: {1}}
    assert [link.own_cores(r, range(6)) for r in range(6)] == [(0,), (1,), (2,), (3,), (0,), (1,)]
    assert [link.own_cores(r, range(2)) for r in range(2)] == [(0, 1), (2, 3)]  # a cell of 2 ranks
    link.cpus[0] = set()
    assert link.own_cores(0, range(2)) is None  # CPUs unknown: left as it is
