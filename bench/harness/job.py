"""Which torchrun or Slurm job this process belongs to, read from the variables they set.

A job is every process that one ``torchrun`` per node, or one ``srun``, started for the same
command. ``shardbench run`` (and ``nightly``, ``max-size``, ``claim``) inside one runs each cell on
the job's first N processes (``job_cells.py``) instead of starting ranks of its own. Reading the
job is pure, an environment in and a ``Job`` or None out, so it is tested without either launcher.

torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` and its
``TORCHELASTIC_*`` variables; its agent then hosts the key-value store the processes meet in.
``srun`` sets ``SLURM_PROCID``, the step's task count and node list; the job's store is then
hosted by rank 0, on the first node of the list (or ``MASTER_ADDR``) at ``MASTER_PORT`` (by
default a port derived from the job id, so two jobs sharing a node do not collide). torchrun's
variables win where both are set (torchrun started by srun).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from shardbench.wording import count

#: the variable a cell's rank processes find their key prefix in (the job's store is at
#: MASTER_ADDR:MASTER_PORT): they meet there instead of in a store of their own
STORE_PREFIX = "SHARDBENCH_STORE_PREFIX"
#: torch's default rendezvous port, for a job that names none (outside Slurm)
DEFAULT_PORT = 29500
#: a Slurm job without MASTER_PORT listens on SLURM_PORT_BASE + (job id mod SLURM_PORT_SPAN)
SLURM_PORT_BASE = 15000
SLURM_PORT_SPAN = 10000


@dataclass(frozen=True)
class Job:
    """This process's place in a job of ``world_size`` processes."""

    launcher: str  # "torchrun" or "slurm"
    rank: int
    world_size: int
    #: which of its node's devices this process drives (LOCAL_RANK, SLURM_LOCALID)
    local_rank: int
    #: where the job's key-value store listens
    master_addr: str
    master_port: int
    #: torchrun's agent hosts the store (every process is its client); otherwise rank 0 does
    agent_store: bool = False
    #: torchrun's restart count: an attempt never reads what an earlier one left in the store
    attempt: int = 0
    #: the job's nodes, in order (Slurm's node list; empty where the launcher does not say)
    nodes: tuple[str, ...] = ()
    #: processes a node holds (torchrun's LOCAL_WORLD_SIZE, Slurm's SLURM_NTASKS_PER_NODE);
    #: None where the launcher does not say
    ranks_per_node: int | None = None

    def describe(self) -> str:
        processes = count(self.world_size, "process", "processes")
        return f"{self.launcher} job of {processes} (this is rank {self.rank})"


def detect_job(environ: Mapping[str, str]) -> Job | None:
    """The job ``environ`` describes, or None outside torchrun and srun. A variable that is set
    but unreadable raises ``ValueError`` naming it and what it should hold."""
    if (
        "RANK" in environ
        and "WORLD_SIZE" in environ
        and ("MASTER_ADDR" in environ or "TORCHELASTIC_RUN_ID" in environ)
    ):
        return _torchrun(environ)
    if "SLURM_PROCID" in environ and _first(environ, SLURM_TASKS) is not None:
        return _slurm(environ)
    return None


def current_job(environ: Mapping[str, str] | None = None) -> Job | None:
    """The job this process runs in when it has more than one process: a job of one process
    (``torchrun --nproc-per-node 1``, ``srun -n 1``) is this machine, and its cells start their
    own ranks as everywhere else."""
    job = detect_job(os.environ if environ is None else environ)
    return job if job is not None and job.world_size > 1 else None


RESTARTS = "TORCHELASTIC_RESTART_COUNT"


def _torchrun(env: Mapping[str, str]) -> Job:
    rank, world = env_int(env, "RANK", minimum=0), env_int(env, "WORLD_SIZE", minimum=1)
    _check_rank(rank, world, "RANK", "WORLD_SIZE")
    if not env.get("MASTER_ADDR"):
        raise ValueError("RANK and WORLD_SIZE are set but MASTER_ADDR is not: start the job with torchrun")
    return Job(
        launcher="torchrun",
        rank=rank,
        world_size=world,
        local_rank=env_int(env, "LOCAL_RANK", minimum=0, default=rank),
        master_addr=env["MASTER_ADDR"],
        master_port=master_port(env) if "MASTER_PORT" in env else DEFAULT_PORT,
        agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        attempt=env_int(env, RESTARTS, minimum=0, default=0),
        ranks_per_node=env_int(env, "LOCAL_WORLD_SIZE", minimum=1) if env.get("LOCAL_WORLD_SIZE") else None,
    )


#: the step's task count: srun sets the SLURM_STEP_* variables for the tasks it starts. A batch
#: script or an salloc shell carries the job's SLURM_PROCID and SLURM_NTASKS as well, but it is
#: one process: read as a job of SLURM_NTASKS, its every command would wait for peers that
#: never come. So only a step is a job (and one step may use fewer tasks than the job has).
SLURM_TASKS = ("SLURM_STEP_NUM_TASKS",)
SLURM_NODELISTS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")


def _slurm(env: Mapping[str, str]) -> Job:
    tasks = _first(env, SLURM_TASKS)
    assert tasks is not None
    rank, world = env_int(env, "SLURM_PROCID", minimum=0), env_int(env, tasks, minimum=1)
    _check_rank(rank, world, "SLURM_PROCID", tasks)
    listed = _first(env, SLURM_NODELISTS)
    nodes = tuple(expand_nodelist(env[listed], listed)) if listed else ()
    addr = env.get("MASTER_ADDR") or (nodes[0] if nodes else "")
    if not addr:
        raise ValueError(
            f"a Slurm job ({', '.join(SLURM_NODELISTS)} unset) needs MASTER_ADDR: the host of rank 0"
        )
    if "MASTER_PORT" in env:
        port = master_port(env)
    elif "SLURM_JOB_ID" in env:
        port = SLURM_PORT_BASE + env_int(env, "SLURM_JOB_ID", minimum=0) % SLURM_PORT_SPAN
    else:
        port = DEFAULT_PORT
    return Job(
        launcher="slurm",
        rank=rank,
        world_size=world,
        local_rank=env_int(env, "SLURM_LOCALID", minimum=0, default=0),
        master_addr=addr,
        master_port=port,
        nodes=nodes,
        ranks_per_node=(
            env_int(env, "SLURM_NTASKS_PER_NODE", minimum=1) if env.get("SLURM_NTASKS_PER_NODE") else None
        ),
    )


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    return next((n for n in names if env.get(n)), None)


def env_int(env: Mapping[str, str], name: str, *, minimum: int, default: int | None = None) -> int:
    """The integer the launcher set in ``name`` (``default`` where it is unset), or ValueError in
    one line naming the variable and what it may hold: a rank or a size read wrong would send
    a process to wait on peers that never come."""
    if name not in env and default is not None:
        return default
    text = env[name].strip()
    if not text.isdigit() or int(text) < minimum:
        raise ValueError(f"{name}={env[name]!r}: expected an integer >= {minimum}")
    return int(text)


def master_port(env: Mapping[str, str]) -> int:
    """``MASTER_PORT``, checked to be a port."""
    port = env_int(env, "MASTER_PORT", minimum=1)
    if port > 65535:
        raise ValueError(f"MASTER_PORT={env['MASTER_PORT']!r}: expected a port from 1 to 65535")
    return port


def _check_rank(rank: int, world: int, rank_name: str, world_name: str) -> None:
    if rank >= world:
        raise ValueError(f"{rank_name}={rank} is not below {world_name}={world}")


_GROUP = re.compile(r"\[([^\]]*)\]")


def expand_nodelist(text: str, name: str = "node list") -> list[str]:
    """Slurm's compressed host list in order: ``node[01-03,07],gpu5`` -> node01, node02, node03,
    node07, gpu5 (zero padding kept; several bracket groups in one name expand left to right)."""
    out: list[str] = []
    for item in _split_top_level(text.strip()):
        out += _expand_item(item, text, name)
    if not out:
        raise ValueError(f"{name}={text!r}: no host in it")
    return out


def _split_top_level(text: str) -> list[str]:
    items, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    items.append(current)
    return [i.strip() for i in items if i.strip()]


def _expand_item(item: str, text: str, name: str) -> list[str]:
    m = _GROUP.search(item)
    if m is None:
        if "[" in item or "]" in item:
            raise ValueError(f"{name}={text!r}: unbalanced brackets in {item!r}")
        return [item]
    head, tail = item[: m.start()], item[m.end() :]
    hosts = []
    for part in m.group(1).split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"{name}={text!r}: {part!r} is not a number or a range like 01-04")
        last = int(hi) if sep else int(lo)
        if last < int(lo):
            raise ValueError(f"{name}={text!r}: the range {part!r} runs backwards")
        hosts += [f"{head}{n:0{len(lo)}d}" for n in range(int(lo), last + 1)]
    return [h for host in hosts for h in _expand_item(host + tail, text, name)]


def job_ranks_per_node(ranks_per_node: int | None) -> int | None:
    """The ranks a node holds, as the process that runs the command sees them: as asked, else the
    job's (torchrun, Slurm), else None (one node). Only that process may read the job: a cell's
    rank processes are given it in their cell (``RankWorld``), since their own
    ``LOCAL_WORLD_SIZE`` counts the ranks sharing their cores (on one machine, all of the
    cell's), not a node's."""
    if ranks_per_node is None and (job := current_job()) is not None:
        ranks_per_node = job.ranks_per_node
    return ranks_per_node


def cell_ranks_per_node(ranks_per_node: int | None, world_size: int) -> int | None:
    """The ranks a node holds for a cell: as asked, else the job's (``job_ranks_per_node``),
    else None (one node); a world smaller than a node is one node."""
    return node_size(job_ranks_per_node(ranks_per_node), world_size)


def node_size(ranks_per_node: int | None, world_size: int) -> int | None:
    """``ranks_per_node`` for a world of ``world_size``: a world smaller than a node is one
    node; None stays None (one node, no tiers)."""
    return None if ranks_per_node is None else min(ranks_per_node, world_size)
