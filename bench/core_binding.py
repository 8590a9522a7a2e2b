"""Each rank on cores of its own: the CPU ranks a cell starts on one host are bound to equal,
disjoint blocks of the cores the launcher may use, as PyTorch's own CPU launcher binds its
instances.

Why: ranks free to move across the cores collide with each other's gloo threads and compute.
Measured on a 2-core host, two ranks of a tiny Transformer: a blocking all-reduce of every
gradient cost 3x what the gloo probe predicts when the ranks were free to move, and what it
predicts when each had its own core; the whole DDP step was 20-30% faster bound. Where ranks
outnumber the cores, rank ``i`` gets core ``i mod cores``: each core then holds the same number
of ranks, and none is left to the scheduler's balancing.

The launcher hands each rank its cores in ``RANK_CORES``; the rank binds itself before it
starts any thread, so its intra-op and gloo threads inherit the binding. Inside a torchrun or
Slurm job the ranks of a node that share CPUs split them the same way, and a rank srun bound to
CPUs of its own keeps them (``JobLink.own_cores``). ``SHARDBENCH_BIND_CORES=0`` leaves every rank
free to move, for a comparison with records made that way.
"""

from __future__ import annotations

import os
from collections.abc import Collection

#: the variable in which the launcher hands a rank its cores, comma-separated
RANK_CORES = "SHARDBENCH_RANK_CORES"
#: the switch: "0" leaves the ranks unbound
SWITCH = "SHARDBENCH_BIND_CORES"
#: what the switch takes
SWITCH_VALUES = ("0", "1")


def binding_on() -> bool:
    """Whether the launcher binds its ranks to cores (the default); one line on a value of the
    switch it does not take."""
    value = os.environ.get(SWITCH, "1").strip() or "1"
    if value not in SWITCH_VALUES:
        raise ValueError(
            f"{SWITCH}={value!r}: expected 1 (bind each rank to its own cores) or 0 (leave them free)"
        )
    return value == "1"


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
    cores`` where the ranks outnumber the cores. None where binding is off or the CPUs are
    unknown."""
    cpus = sorted(own_cpus() if cpus is None else cpus)
    if not cpus or not binding_on():
        return None
    if ranks > len(cpus):
        return (cpus[index % len(cpus)],)
    each = len(cpus) // ranks
    return tuple(cpus[index * each : (index + 1) * each])


def cores_each(ranks: int, cpus: Collection[int] | None = None) -> int:
    """How many cores each of ``ranks`` ranks sharing ``cpus`` is bound to; 0 where unbound."""
    cores = cores_of(0, ranks, cpus)
    return len(cores) if cores else 0


def as_variable(cores: tuple[int, ...] | None) -> dict[str, str]:
    """The launcher's variable for a rank bound to ``cores``; none for an unbound rank."""
    return {RANK_CORES: ",".join(map(str, cores))} if cores else {}


def bind_from_environment() -> tuple[int, ...] | None:
    """In a rank, before it starts any thread: bind this process to the cores the launcher
    handed it (``RANK_CORES``); the cores bound, or None where it handed none."""
    handed = os.environ.get(RANK_CORES, "").strip()
    if not handed:
        return None
    cores = tuple(int(c) for c in handed.split(","))
    bind(cores)
    return cores


def bind(cores: Collection[int]) -> None:
    """Bind the calling thread (and the threads it starts after) to ``cores``; nothing where the
    OS has no affinity call."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)


def binding_key(ranks: int) -> str:
    """What a probe's cache key says of how ``ranks`` ranks sit on the cores: a probe of bound
    ranks and one of free ranks are different measurements."""
    each = cores_each(ranks)
    return f"bound {each} core{'s' if each != 1 else ''} each" if each else "unbound"
