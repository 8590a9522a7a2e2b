"""Each rank on cores of its own: the CPU ranks a cell starts on one host are bound to equal,
disjoint blocks of the cores the launcher may use (consecutive CPU ids, as the OS numbers them).

Why: ranks free to move across the cores collide with each other's gloo threads and compute.
Measured on a 2-core host, two ranks of a tiny Transformer: a blocking all-reduce of every
gradient took about 3x the gloo probe's prediction with the ranks free, and about the
prediction with each rank bound to its own core; the whole DDP step was 20-30% faster bound.
Where ranks outnumber the cores by a whole multiple, rank ``i`` gets core ``i mod cores``, so each
core holds as many ranks; where they do not divide (3 ranks on 2 cores) the ranks are left free,
since a core holding more ranks than the others would make its ranks the slowest.

The launcher hands each rank its cores in ``RANK_CORES``; the rank binds all its threads at
start, so the threads it starts later (intra-op) inherit the binding, except the threads
torch.distributed starts for a process group (gloo's run loops and its worker), which may run
on any of the CPUs the ranks share (``leave_comm_threads_free``). With one core per rank there is
no core to spare for them: bound to the rank's core, a collective that runs while the rank
computes (FairScale's ShardedDDP reducing each gradient as backward makes it, DeepSpeed's
ZeRO-3) waits for the compute thread's time slice. Measured on the 2-core host, transformer
tiny: fairscale-zero2 took 2.6x as long with the whole rank bound as with the ranks free, and
the same as free with only its compute bound; every other cell measured was as fast or faster
with its compute bound (0.79-1.00 of free). Inside a torchrun or
Slurm job the ranks of a node that share one CPU set split it the same way, and a rank srun bound
to CPUs of its own keeps them (``JobLink.own_cores``). ``SHARDBENCH_BIND_CORES=0`` leaves every
rank free to move, for a comparison with records made that way.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Collection

#: the variable in which the launcher hands a rank its cores, comma-separated
RANK_CORES = "SHARDBENCH_RANK_CORES"
#: the switch: "0" leaves the ranks unbound
SWITCH = "SHARDBENCH_BIND_CORES"
#: what the switch takes
SWITCH_VALUES = ("0", "1")
#: the hint where bound runs meet records made free
RUN_FREE = f"{SWITCH}=0 runs the ranks free"


def binding_on() -> bool:
    """Whether the launcher binds its ranks to cores (the default); one line on a value of the
    switch it does not take."""
    value = os.environ.get(SWITCH, "1").strip() or "1"
    if value not in SWITCH_VALUES:
        raise ValueError(
            f"{SWITCH}={value!r}: expected 1 (bind each rank to its own cores) or 0 (leave them free)"
        )
    return value == "1"


def launcher_binding(device: str) -> str | None:
    """How the launcher places a cell's ranks on ``device``: "bound" or "free" on the CPU (the
    record's ``env["rank_binding"]``), None on a GPU, whose ranks it does not bind."""
    if device != "cpu":
        return None
    return "bound" if binding_on() else "free"


def own_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on, in order (a container, ``taskset`` or srun's binding
    may allow fewer than the machine has); empty where the OS does not say (macOS)."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:
        return ()


def cores_of(index: int, ranks: int, cpus: Collection[int] | None = None) -> tuple[int, ...] | None:
    """The cores the ``index``-th of ``ranks`` ranks sharing ``cpus`` (default: this process's)
    is bound to: the ``index``-th of ``ranks`` equal consecutive blocks, or the core ``index mod
    cores`` where the ranks are a whole multiple of the cores. None where binding is off, the
    CPUs are unknown, or the ranks outnumber the cores by no whole multiple (left free)."""
    cpus = sorted(own_cpus() if cpus is None else cpus)
    if not cpus or not binding_on():
        return None
    if ranks > len(cpus):
        return (cpus[index % len(cpus)],) if ranks % len(cpus) == 0 else None
    each = len(cpus) // ranks
    return tuple(cpus[index * each : (index + 1) * each])


def cores_each(ranks: int, cpus: Collection[int] | None = None) -> int:
    """How many cores each of ``ranks`` ranks sharing ``cpus`` is bound to; 0 where unbound."""
    cores = cores_of(0, ranks, cpus)
    return len(cores) if cores else 0


def unrestricted_cores_of(index: int, ranks: int) -> tuple[int, ...] | None:
    """``cores_of`` for a rank that no launcher handed cores (a worker torchrun starts itself),
    where nothing restricted this process: its CPUs are all the machine's, so its node's ranks
    share them. None where something did (srun's binding, a container's set): that stands."""
    cpus = own_cpus()
    return cores_of(index, ranks, cpus) if cpus and len(cpus) == os.cpu_count() else None


def as_variable(cores: tuple[int, ...] | None) -> dict[str, str]:
    """The launcher's variable for a rank bound to ``cores``; none for an unbound rank."""
    return {RANK_CORES: ",".join(map(str, cores))} if cores else {}


def bind_from_environment() -> tuple[int, ...] | None:
    """In a rank, at its start: bind this process, every thread of it, to the cores the launcher
    handed it (``RANK_CORES``); the cores bound, or None where it handed none or they cannot be
    bound (a line on stderr says why, and the rank runs free: a binding is never worth a cell)."""
    handed = os.environ.get(RANK_CORES, "").strip()
    if not handed:
        return None
    try:
        cores = tuple(int(c) for c in handed.split(","))
        return cores if bind_process(cores) else None
    except (ValueError, OSError) as e:
        print(f"shardbench: {RANK_CORES}={handed!r} not bound ({e}); this rank runs free", file=sys.stderr)
        return None


def bind_process(cores: Collection[int]) -> bool:
    """Bind every thread of this process to ``cores``, and so the threads it starts after;
    whether the OS has an affinity call to do it with."""
    if not hasattr(os, "sched_setaffinity"):
        return False
    for thread in _threads() or {0}:  # no /proc: the calling thread alone
        try:
            os.sched_setaffinity(thread, cores)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
    return True


def _threads() -> set[int]:
    """This process's threads by id; empty where ``/proc`` does not list them."""
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def leave_comm_threads_free(cpus: Collection[int]) -> bool:
    """In a bound rank: every process group it creates from now (``init_process_group``,
    ``new_group``, a device mesh's groups) starts its threads on all of ``cpus``, not on the
    rank's own cores (see the module docstring). Whether it could: it wraps torch's private
    ``distributed_c10d._new_process_group_helper``, through which every group is made; where a
    torch lacks it, the groups' threads stay on the rank's cores."""
    if not hasattr(os, "sched_setaffinity"):
        return False
    try:
        from torch.distributed import distributed_c10d
    except ImportError:
        return False
    made = getattr(distributed_c10d, "_new_process_group_helper", None)
    if made is None:
        return False
    if getattr(made, "frees_comm_threads", False):
        return True

    @functools.wraps(made)
    def making_free(*args: object, **kwargs: object) -> object:
        before = _threads()
        try:
            return made(*args, **kwargs)
        finally:
            for thread in _threads() - before:
                try:
                    os.sched_setaffinity(thread, cpus)
                except OSError:  # a thread that ended meanwhile, or a CPU gone
                    pass

    making_free.frees_comm_threads = True  # type: ignore[attr-defined]
    distributed_c10d._new_process_group_helper = making_free
    return True


def bind_thread(cores: Collection[int]) -> None:
    """Bind the calling thread (and the threads it starts after) to ``cores``; the process's
    other threads stay as they are. Nothing where the OS has no affinity call."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)


def binding_key(ranks: int) -> str:
    """What a probe's cache key says of how ``ranks`` ranks sit on the cores: a probe of bound
    ranks and one of free ranks are different measurements (one rank alone: neither)."""
    if ranks <= 1:
        return "alone"
    each = cores_each(ranks)
    return f"compute bound to {each} core{'s' if each != 1 else ''} each" if each else "unbound"
