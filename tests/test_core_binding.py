"""Each CPU rank the launcher starts is bound to cores of its own (``core_binding``): the blocks,
the launcher's variables, the rank's own binding, the probes' copies, and the switch."""

from __future__ import annotations

import multiprocessing
import os
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from shardbench import core_binding
from shardbench.core_binding import RANK_CORES, SWITCH, binding_key, cores_each, cores_of
from shardbench.harness.job_link import JobLink
from shardbench.harness.launch import local_places
from shardbench.harness.validate import plan_cells
from shardbench.prediction.at_once import at_once
from shardbench.records import capture_env
from shardbench.studies.machines import env_changes, for_machine, rank_binding
from tests.cells import tiny_cell
from tests.records import make_record

affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="the OS has no CPU affinity call")


@pytest.fixture(autouse=True)
def _binding_as_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from the default (binding on, no cores handed), whatever the shell set."""
    monkeypatch.delenv(SWITCH, raising=False)
    monkeypatch.delenv(RANK_CORES, raising=False)


def test_equal_disjoint_blocks_and_round_robin_past_the_cores() -> None:
    eight = range(8)
    assert [cores_of(i, 2, eight) for i in range(2)] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert [cores_of(i, 3, eight) for i in range(3)] == [(0, 1), (2, 3), (4, 5)]  # 2 left unused
    assert cores_of(0, 1, [5, 3]) == (3, 5)
    # more ranks than cores: each core holds as many ranks, none left to the scheduler
    assert [cores_of(i, 4, [2, 7]) for i in range(4)] == [(2,), (7,), (2,), (7,)]
    # no whole multiple (3 on 2): one core would hold two ranks and the other one; left free
    assert [cores_of(i, 3, [0, 1]) for i in range(3)] == [None, None, None] and cores_each(3, [0, 1]) == 0
    assert binding_key(1) == "alone"  # one copy on every core: no binding to tell apart
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
    started, read = threading.Event(), threading.Event()
    seen: list[int] = []

    def earlier_thread() -> None:  # started before the binding, as a library's might be
        started.set()
        read.wait(30)
        seen.extend(sorted(os.sched_getaffinity(0)))

    thread = threading.Thread(target=earlier_thread)
    thread.start()
    started.wait(30)
    os.environ[RANK_CORES] = handed
    bound = core_binding.bind_from_environment()
    read.set()
    thread.join(30)
    queue.put((bound, sorted(os.sched_getaffinity(0)), seen))


@affinity
def test_a_rank_binds_every_thread_to_the_cores_it_was_handed() -> None:
    cpus = core_binding.own_cpus()
    core = cpus[-1]
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_bound_here, args=(queue, str(core)))
    child.start()
    bound, main_thread, earlier_thread = queue.get(timeout=60)
    child.join(timeout=30)
    assert bound == (core,) and main_thread == [core] and earlier_thread == [core]
    assert len(cpus) == 1 or main_thread != list(cpus)  # bound narrower than the parent's CPUs


def _group_threads_free(queue: multiprocessing.Queue, core: int, store: str) -> None:
    import torch.distributed as dist

    shared = core_binding.own_cpus()
    core_binding.bind_process([core])
    assert core_binding.leave_comm_threads_free(shared)
    before = core_binding._threads()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    dist.new_group([0])  # a strategy's own group, made later
    started = core_binding._threads() - before
    queue.put(
        (
            sorted(os.sched_getaffinity(0)),
            [sorted(os.sched_getaffinity(t)) for t in started],
            list(shared),
        )
    )
    dist.destroy_process_group()


@affinity
def test_a_bound_ranks_process_groups_run_their_threads_on_every_shared_core(tmp_path: Path) -> None:
    core = core_binding.own_cpus()[0]
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_group_threads_free, args=(queue, core, str(tmp_path / "store")))
    child.start()
    main_thread, group_threads, shared = queue.get(timeout=60)
    child.join(timeout=30)
    assert main_thread == [core]  # the compute stays on the rank's core
    assert len(group_threads) >= 2 and all(t == shared for t in group_threads)  # both groups' threads


def test_cores_that_cannot_be_bound_leave_the_rank_free_with_a_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    before = core_binding.own_cpus()
    for handed in ("0,x", str(1 << 20)):  # not a number; a CPU nobody has
        monkeypatch.setenv(RANK_CORES, handed)
        assert core_binding.bind_from_environment() is None
        assert f"{RANK_CORES}={handed!r} not bound" in capsys.readouterr().err
    assert core_binding.own_cpus() == before


@affinity
def test_probe_copies_run_on_their_ranks_cores_and_leave_the_caller_as_it_was() -> None:
    own = core_binding.own_cpus()
    before = os.sched_getaffinity(0)

    def where(index: int, together: object) -> tuple[int, ...]:
        return tuple(sorted(os.sched_getaffinity(threading.get_native_id())))

    assert at_once(where, 2, 1) == [cores_of(i, 2, own) for i in range(2)]
    assert os.sched_getaffinity(0) == before


def _record(placement: dict[str, int] | None, cpu: str = "Xeon", **env: str) -> SimpleNamespace:
    """What the environment check reads of a CPU record."""
    facts = {"torch": "2.11.0", "cpu_model": cpu, **env}
    return SimpleNamespace(device="cpu", schema=4, env=facts, placement=placement)


def test_every_record_says_how_the_launcher_placed_its_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    assert capture_env("cpu")["rank_binding"] == "bound"  # a failed cell's record too: no placement needed
    assert "rank_binding" not in capture_env("cuda")
    monkeypatch.setenv(SWITCH, "0")
    assert capture_env("cpu")["rank_binding"] == "free"
    failed = _record(None, rank_binding="bound")
    assert rank_binding(failed) == rank_binding(_record({"ranks": 2}, rank_binding="bound")) == "bound"


def test_bound_and_free_runs_do_not_compare_but_are_one_machine() -> None:
    # a baseline of two processors: records from before binding, one set with placement, one without
    baseline = [_record({"ranks": 2, "cores": 2}), _record(None, cpu="EPYC")]
    assert [rank_binding(r) for r in baseline] == ["free", None]  # None: unknown, not compared
    bound_xeon = [_record({"ranks": 2, "cores": 2, "bound_cores_each": 1}, rank_binding="bound")]
    # the processor picks the set; the binding is then named as what differs
    assert for_machine(baseline, bound_xeon) == baseline[:1]
    assert env_changes(for_machine(baseline, bound_xeon), bound_xeon) == {
        "rank_binding": (["free"], ["bound"])
    }
    bound_epyc = [_record({"ranks": 2, "cores": 2, "bound_cores_each": 1}, cpu="EPYC", rank_binding="bound")]
    assert for_machine(baseline, bound_epyc) == baseline[1:] and env_changes(baseline[1:], bound_epyc) == {}
    # GPU records have no binding
    assert rank_binding(SimpleNamespace(device="cuda", schema=4, env={}, placement={"ranks": 2})) is None


def test_measuring_bound_against_a_free_baseline_is_refused_before_anything_runs() -> None:
    from shardbench.cli.common import UsageError, require_env_of

    free = replace(make_record(env=capture_env("cpu")), placement={"ranks": 2, "cores": 2})
    free.env.pop("rank_binding")  # written before binding
    with pytest.raises(UsageError, match=r"rank_binding: \['free'\] there, \['bound'\] here.*BIND_CORES=0"):
        require_env_of([free], "cpu", "the baseline", allow=False)
    require_env_of([free], "cpu", "the baseline", allow=True)


def test_a_jobs_ranks_split_the_cpus_they_share_and_keep_cpus_of_their_own() -> None:
    link = JobLink.__new__(JobLink)  # the store is not what is tested: its ranks' CPUs and hosts
    link.host = lambda rank: "a" if rank < 4 else "b"
    # torchrun: the ranks of host a share its 4 CPUs; srun bound host b's ranks to one CPU each
    link.cpus = {0: {0, 1, 2, 3}, 1: {0, 1, 2, 3}, 2: {0, 1, 2, 3}, 3: {0, 1, 2, 3}, 4: {0}, 5: {1}}
    assert [link.own_cores(r, range(6)) for r in range(6)] == [(0,), (1,), (2,), (3,), (0,), (1,)]
    assert [link.own_cores(r, range(2)) for r in range(2)] == [(0, 1), (2, 3)]  # a cell of 2 ranks
    link.cpus[0] = set()
    assert link.own_cores(0, range(2)) is None  # CPUs unknown: left as it is
    assert link.own_cores(1, range(2)) is None  # beside a rank whose CPUs are unknown
    # sets that overlap without being the same: a split of one alone would not keep them apart
    link.cpus.update({0: {0, 1, 2, 3}, 1: {0, 1}})
    assert [link.own_cores(r, range(2)) for r in range(2)] == [None, None]
    assert link.own_cores(4, range(6)) == (0,)  # another node's rank is not its neighbour
