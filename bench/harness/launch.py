"""Start a world of N ranks for one cell and collect their results into a record.

Each rank is a fresh ``python -m shardbench.harness.worker`` process, wired up with the variables
torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR, ...), so the worker runs unchanged under torchrun
for multi-node jobs. Fresh processes also isolate cells: a crash, an OOM or a leaked allocation
in one cell cannot affect the next.

Process hygiene is the launcher's first duty: ranks never outlive it. Each rank leads its own
process group (so a terminal's Ctrl-C reaches the launcher, which stops them in order, and
anything a rank spawns is stopped with it) and asks the kernel to kill it if the launcher dies
(``PR_SET_PDEATHSIG``). On every exit path - success, a failed rank, the deadline, an exception
such as an interrupt - the ranks still alive get SIGTERM, then SIGKILL, and are reaped, all with
bounded waits; the cell's temporary directory goes with them.

On the CPU, ranks are forked from a warm server (``multiprocessing``'s forkserver, started once
per launcher process with torch, the strategies and the workloads imported), not exec'd: a rank
then starts in milliseconds instead of re-importing torch and transformers (seconds per rank and
per cell on a 2-core machine), while still being a fresh process per cell. The server is a fresh
interpreter that never runs a tensor op, so a fork inherits no thread pool. CUDA ranks are exec'd:
a library that touched CUDA at import would make every forked rank unusable. A fake cell planned
for CUDA on a host without it touches no device, and forks like a CPU rank (``exec_rank``).

Every wait is bounded: the cell's timeout caps the whole world, and once one rank has failed the
others get a short grace period (they are probably blocked in a collective with the dead rank)
before they are stopped. At the deadline each live rank first dumps its Python stack (faulthandler,
SIGUSR1), so the record says where each rank was stuck and blames the one not waiting on a peer.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import json
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from shardbench import core_binding
from shardbench.harness import counting, guardian
from shardbench.harness.config import CellConfig, threads_per_rank
from shardbench.harness.job import job_ranks_per_node
from shardbench.harness.resolved_cell import ResolvedCell
from shardbench.harness.result import RankResult, build_record, signal_name
from shardbench.paths import path_component
from shardbench.records import Record

FAILED_RANK_GRACE_S = 5.0
TERMINATE_GRACE_S = 3.0
STACK_DUMP_WAIT_S = 1.0
#: how often a wait looks again, here (a rank's end) and in a job's store (``job_link.py``)
POLL_S = 0.05


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: the kernel's count of the processes its OOM killer has killed since boot (Linux)
VMSTAT = Path("/proc/vmstat")


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed since boot, or None where the
    kernel does not say. A rank the OOM killer ends gets SIGKILL and writes nothing; the
    count rising while its cell ran is what tells that death from a ``kill -9``."""
    try:
        for line in VMSTAT.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


#: the fork server's first import, which imports the rest (``forkserver_context``)
GUARD = "shardbench.harness.fork_server_guard"

#: imported once in the fork server, so ranks start warm: the worker (torch, the strategies) and
#: each workload's library; a module that fails to import is skipped by the server
PRELOAD = [
    GUARD,  # first: the server ends with its launcher
    "shardbench.harness.worker",
    "shardbench.models.transformer",
    "shardbench.models.imagegpt",
    "shardbench.models.swav",
    "shardbench.models.deepspeech2",
    "transformers.models.bert.modeling_bert",
    "transformers.models.imagegpt.modeling_imagegpt",
    "torchvision.models.resnet",
]


#: what the fork server imports beyond ``PRELOAD`` for the cells this process forks ranks of
#: (``import_for``)
_IMPORTED_FOR_CELLS: list[str] = []


def import_for(cells: Iterable[CellConfig]) -> None:
    """Have this process's fork server also import what the forked ranks of ``cells`` import at
    set-up, beyond ``PRELOAD``: their strategies' ``rank_imports`` and their workloads'
    (``specs.rank_imports``), which would otherwise cost every rank again (DeepSpeed's engine
    imports torch's inductor: over a second a rank on a 2-core CPU, four ranks a cell). Only
    modules the cells need: a run without DeepSpeed starts its server as fast as before. Takes
    effect when the server starts, at the first forked rank: a run names all its cells before
    its first (``run_cells``), and each cell names its own; a module a later cell adds reaches
    no running server, and that cell's ranks import it themselves as they always could."""
    from shardbench.models.specs import rank_imports
    from shardbench.strategies.registry import strategy_card

    for cell in cells:
        if exec_rank(cell):
            continue
        for module in (*strategy_card(cell.strategy).rank_imports, *rank_imports(cell.workload)):
            if module not in PRELOAD and module not in _IMPORTED_FOR_CELLS:
                _IMPORTED_FOR_CELLS.append(module)


def fork_server_preload() -> list[str]:
    """What this process's fork server imports when it starts: ``PRELOAD`` (its guard first),
    then what ``import_for`` added."""
    return [*PRELOAD, *_IMPORTED_FOR_CELLS]


def forkserver_context(imports: list[str] | None = None) -> multiprocessing.context.BaseContext:
    """multiprocessing's fork-server context, its server (when it starts, at the first forked
    rank) importing ``imports`` (``fork_server_preload()`` unless given) through its guard, each
    on its own: a module that raises there is left to the rank that needs it
    (``fork_server_guard``)."""
    rest = [m for m in (fork_server_preload() if imports is None else imports) if m != GUARD]
    os.environ[guardian.FORK_SERVER_IMPORTS] = ",".join(rest)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([GUARD])
    return ctx


def output_to_log(log_path: str) -> None:
    """In a forked child: stdout and stderr to ``log_path``. A launcher interrupted while the
    child was starting has already removed the log's directory; the child then has nothing to
    run and nothing to report, so it exits quietly rather than print a traceback over the
    launcher's own last line."""
    try:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except FileNotFoundError:
        os._exit(1)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _rank_main(argv: list[str], env: dict[str, str], log_path: str) -> None:
    """A rank, in its forked process: its own process group, killed with its parent, output to
    its log, the launcher's environment for it, then the worker."""
    os.setpgid(0, 0)
    _die_with_parent()
    output_to_log(log_path)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the launcher asks where a hang is
    os.environ.clear()
    os.environ.update(env)
    from shardbench.harness.worker import main

    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


class _ExecRank:
    """An exec'd rank (``python -m shardbench.harness.worker``), with the surface of a
    ``multiprocessing`` process that the launcher uses: pid, exitcode, join."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        with log_path.open("wb") as log:
            self._popen = subprocess.Popen(
                [sys.executable, "-m", "shardbench.harness.worker", *argv],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        self.pid = self._popen.pid

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()

    def join(self, timeout: float) -> None:
        try:
            self._popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL this rank when the launcher dies (Linux only)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


#: the prefix of what torchrun's agent tells the workers it starts. A rank this launcher starts
#: is not one of them: given TORCHELASTIC_USE_AGENT_STORE, torch's env:// rendezvous would join
#: the agent's store as a client at the cell's own port, where nothing serves, and wait there
AGENT_VARIABLES = "TORCHELASTIC_"


def local_places(processes: int, cell: CellConfig | None = None) -> dict[int, dict[str, str]]:
    """The variables of each rank of a cell started on this host alone: what torchrun would
    set, meeting at a free local port, the cores shared among the ranks, and a CPU rank's own
    cores to bind to (``core_binding``; a simulated rank gets the block one rank of its world
    would)."""
    bound = cell is not None and cell.device == "cpu"
    # a simulated rank shares the cores as one rank of its world: the threads it sets itself
    sharing = cell.world_plan().world_size if cell is not None and cell.simulate else processes
    port, threads = str(_free_port()), str(threads_per_rank(sharing))
    return {
        rank: dict(
            RANK=str(rank),
            WORLD_SIZE=str(processes),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(processes),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            OMP_NUM_THREADS=threads,
            MKL_NUM_THREADS=threads,
            **(core_binding.as_variable(core_binding.cores_of(rank, sharing)) if bound else {}),
        )
        for rank in range(processes)
    }


def cell_for_ranks(cell: CellConfig) -> CellConfig:
    """``cell`` as its rank processes get it: with the ranks a node holds as this process reads
    them (the job's, where not asked). A rank cannot tell them from its own variables: its
    ``LOCAL_WORLD_SIZE`` counts the ranks sharing its cores (``job_ranks_per_node``)."""
    return replace(cell, ranks_per_node=job_ranks_per_node(cell.ranks_per_node))


def exec_rank(cell: CellConfig) -> bool:
    """Whether the cell's ranks are exec'd rather than forked warm: a CUDA rank is (a library
    that touched CUDA at import would make a forked one unusable), except a fake cell planned
    on the CPU of a host without CUDA (``worker.planned_off_device``), which touches no device.
    That one forks like a CPU rank, so a plan's cells do not each import torch and the
    workload's library again: at a plan's many shard widths, that import is the same work
    repeated for every cell."""
    if cell.device != "cuda":
        return False
    from shardbench.harness.worker import planned_off_device

    return not planned_off_device(cell)


class RankWorld:
    """The rank processes of one cell on this host: started together, stopped together.

    By default every rank of the cell, meeting at a free local port. Inside a torchrun or Slurm
    job each process of the job starts only its own rank of the cell (``places``: rank -> the
    variables it gets), and the ranks meet in the job's store (``job_cells.py``)."""

    def __init__(
        self,
        cell: CellConfig,
        processes: int,
        tmpdir: Path,
        places: Mapping[int, Mapping[str, str]] | None = None,
        counts: counting.StepCounts | None = None,
    ) -> None:
        self.cell, self.tmpdir = cell, tmpdir
        #: the step counts of the cells run before, handed to rank 0; its own come back here
        self.counts = counts if counts is not None else counting.StepCounts()
        self.places = dict(places) if places is not None else local_places(processes, cell)
        self.ranks = sorted(self.places)
        self.procs: list[Any] = []  # multiprocessing processes (forked) or _ExecRank (exec'd), as ranks
        self.stopped: set[int] = set()  # ranks the launcher stopped after a peer failed
        self.exited_at: dict[int, float] = {}
        self.oom_kills_at_start = oom_kills()
        cell_file = tmpdir / "cell.json"
        cell_file.write_text(json.dumps(cell_for_ranks(cell).to_json()))
        self.counts.export(tmpdir / counting.HANDED, cell=cell)
        import_for([cell])
        try:
            for rank in self.ranks:
                env = {
                    k: v
                    for k, v in os.environ.items()
                    if not k.startswith(AGENT_VARIABLES)
                    and k not in (core_binding.RANK_CORES, guardian.FORK_SERVER_IMPORTS)
                }
                env.update(
                    self.places[rank],
                    # where the command runs: a relative ``file.py:factory`` workload is resolved
                    # against it (a forked rank runs in the directory its fork server started in)
                    SHARDBENCH_CALLER_CWD=os.getcwd(),
                )
                argv = ["--cell", str(cell_file), "--result-dir", str(tmpdir)]
                log = tmpdir / f"rank{rank}.log"
                if exec_rank(cell):
                    self.procs.append(_ExecRank(argv, env, log))
                    continue
                proc = forkserver_context().Process(
                    target=_rank_main, args=(argv, env, str(log)), name=f"rank{rank}"
                )
                proc.start()
                self.procs.append(proc)
        except BaseException:
            self.stop()
            raise

    def _by_rank(self) -> list[tuple[int, Any]]:
        return list(zip(self.ranks, self.procs, strict=False))

    def wait(self, timeout_s: float, peer_failed: Callable[[], bool] | None = None) -> bool:
        """Wait for every rank; stop the rest a grace period after one fails, here or (as
        ``peer_failed`` says) in another process of the job. Returns True when the deadline
        passed with ranks still running."""
        deadline = time.monotonic() + timeout_s
        failed_at: float | None = None
        while True:
            now = time.monotonic()
            for rank, p in self._by_rank():
                if p.exitcode is not None and rank not in self.exited_at:
                    self.exited_at[rank] = time.time()
                    if p.exitcode != 0 and failed_at is None:
                        failed_at = now
            if len(self.exited_at) == len(self.procs):
                return False
            if now > deadline:
                return True
            if failed_at is None and peer_failed is not None and peer_failed():
                failed_at = now
            if failed_at is not None and now - failed_at > FAILED_RANK_GRACE_S:
                self.stopped = {r for r, p in self._by_rank() if p.exitcode is None}
                return False
            time.sleep(POLL_S)

    def failed(self) -> bool:
        """Whether a rank of this host ended without success."""
        return any(p.exitcode not in (None, 0) for p in self.procs)

    def dump_stacks(self) -> None:
        """Ask each live rank to write its Python stack to its log (the worker registered
        faulthandler on SIGUSR1), so a hang says where it is."""
        live = [p for p in self.procs if p.exitcode is None]
        for p in live:
            try:
                os.kill(p.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        if live:
            time.sleep(STACK_DUMP_WAIT_S)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL, every rank's process group; reap; all bounded."""
        for sig, grace in ((signal.SIGTERM, TERMINATE_GRACE_S), (signal.SIGKILL, TERMINATE_GRACE_S)):
            for p in self.procs:
                try:
                    os.killpg(p.pid, sig)  # the rank and anything it spawned
                except (ProcessLookupError, PermissionError):
                    pass
            end = time.monotonic() + grace
            while any(p.exitcode is None for p in self.procs) and time.monotonic() < end:
                time.sleep(POLL_S)
        for p in self.procs:
            p.join(timeout=TERMINATE_GRACE_S)
            if p.exitcode is None:  # unkillable (D state): reported, not waited for forever
                print(f"shardbench: rank process {p.pid} did not exit after SIGKILL", file=sys.stderr)

    def results(self, timed_out: bool) -> list[RankResult]:
        self.counts.adopt(self.tmpdir / counting.COUNTED)
        out = []
        for rank, proc in self._by_rank():
            path = self.tmpdir / f"rank{rank}.json"
            log = self.tmpdir / f"rank{rank}.log"
            if path.exists():
                out.append(RankResult.read(path))
            elif timed_out and rank not in self.exited_at:
                where = stuck_at(_tail(log, 20000))
                out.append(
                    RankResult(
                        rank=rank,
                        status="timeout",
                        error=f"rank {rank}: no result within {self.cell.timeout_s:g}s"
                        + (f"; stuck in {where}" if where else ""),
                        failed_at=None if _waiting_on_peer(where) else time.time(),
                    )
                )
            elif rank in self.stopped:
                out.append(
                    RankResult(
                        rank=rank,
                        status="error",
                        error=f"rank {rank}: stopped by the launcher after a peer failed",
                        stopped_by_launcher=True,
                        signal=signal_name(proc.exitcode),
                    )
                )
            else:
                sig = signal_name(proc.exitcode)
                how = f"killed by {sig}" if sig else f"exited with code {proc.exitcode}"
                out_of_memory = sig == "SIGKILL" and self._oom_killer_ran()
                if out_of_memory:
                    how += " while the kernel's OOM killer ran (the host ran out of memory)"
                out.append(
                    RankResult(
                        rank=rank,
                        status="oom" if out_of_memory else "error",
                        error=f"rank {rank}: {how} and no result; its output ends:\n{_tail(log)}",
                        failed_at=self.exited_at.get(rank),
                        signal=sig,
                        vanished=True,
                    )
                )
        return out

    def _oom_killer_ran(self) -> bool:
        """Whether the kernel's OOM killer killed a process since this cell's ranks started."""
        now = oom_kills()
        return self.oom_kills_at_start is not None and now is not None and now > self.oom_kills_at_start


_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')


def stuck_at(log_text: str) -> str | None:
    """The innermost frame of the main thread in the last faulthandler dump of a log."""
    start = log_text.rfind("Current thread")
    if start < 0:
        start = log_text.rfind("Thread 0x")
    if start < 0:
        return None
    m = _FRAME.search(log_text, start)
    return f"{m.group(3)} ({m.group(1)}:{m.group(2)})" if m else None


def _waiting_on_peer(where: str | None) -> bool:
    """A rank stuck inside torch (a collective, or backward waiting for DDP's reduction) is
    usually waiting for a peer; one stuck anywhere else is the likelier cause of a hang."""
    return where is None or "/torch/" in where


def launcher_dir() -> Path:
    """The launcher's private directory (``guardian.private_dir``), also multiprocessing's: the
    fork server's socket lives there, short whatever ``TMPDIR`` is, and goes with the launcher."""
    private = guardian.private_dir()
    config = getattr(multiprocessing.process.current_process(), "_config", None)
    if isinstance(config, dict) and not config.get("tempdir"):  # (a private attribute)
        config["tempdir"] = str(private)
    return private


class CellEndsRun(Exception):
    """Raised by a cell's launcher when nothing can run after this cell (a process of the job
    is gone): carries the cell's record, which the run keeps before it stops."""

    exit_code = 1

    def __init__(self, message: str, record: Record) -> None:
        super().__init__(message)
        self.record = record

    @property
    def because(self) -> str:
        return f"stopped: {self}"


#: runs a cell on a torchrun or Slurm job's processes rather than this host's ranks (rank 0's
#: ``job_cells.Leader.run_cell``): the commands that run cells are handed it inside a job, and
#: None on one machine
JobCells = Callable[..., Record]


@contextlib.contextmanager
def kept_counts(owner: str) -> Iterator[counting.StepCounts]:
    """The step counts ``owner`` (a run, a job's command) kept from its earlier cells, for the
    next; what the cell adds is kept when it ends. They live in the launcher's private
    directory, so they go with it, and by owner, so that no run is handed another's."""
    counts = counting.StepCounts()
    counts.adopt(counts_file(owner))
    yield counts
    with contextlib.suppress(OSError):  # a count not kept is made again, nothing lost
        counts.export(counts_file(owner))


def counts_file(owner: str) -> Path:
    return launcher_dir() / f"counts-{path_component(owner, what='run', separators='replace')}.json"


def run_cell(cell: CellConfig, *, run_id: str) -> Record:
    """Run one cell in fresh processes and return its record (never raises for a failed cell;
    an exception from outside, e.g. an interrupt, stops the ranks and propagates)."""
    resolved = ResolvedCell.of(cell)
    plan = resolved.world_plan()
    start = time.perf_counter()
    with (
        kept_counts(f"run {run_id}") as counts,
        tempfile.TemporaryDirectory(prefix="cell-", dir=launcher_dir()) as tmp,
    ):
        world = RankWorld(cell, plan.processes, Path(tmp), counts=counts)
        try:
            timed_out = world.wait(cell.timeout_s)
            if timed_out:
                world.dump_stacks()
        finally:
            world.stop()
        results = world.results(timed_out)
    return build_record(
        resolved, plan, results, run_id=run_id, wall_s=time.perf_counter() - start, processes=plan.processes
    )
