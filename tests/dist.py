"""Run a function on N gloo ranks on the CPU, for distributed tests.

Each rank is a fresh process joined through a FileStore in a temporary directory (no network
ports to collide), forked by a forkserver that has imported torch once ("spawn" would import it
again in every rank: seconds each, on two busy cores). Every wait is bounded: a rank that raises
has its traceback re-raised in the parent, and a world that does not finish within
``timeout_s`` is killed and reported, never left hanging. ``fn(rank, world_size, *args)`` must be
a module-level (picklable) function; its return value comes back to the parent, one per rank.

``run_distributed`` starts a fresh world per call (for tests of failure and hangs). Even forked,
a world's ranks import what ``fn`` needs (strategies, models: seconds), so checks that only
need *a* world use ``run_in_world``: one ``World`` per size, started at first use and kept for
the session, runs them one after another. A check must leave no global state behind (seed its
own RNG, tear down what it builds); a check that fails or hangs kills its world, and the next
check of that size starts a new one. ``run_simulated_here`` runs ``fn`` as rank 0 of a fake
world of N in this process: for checks that need a process group to exist but no communication.

With ``check_exit=True`` (``run_distributed`` only) a rank must also exit cleanly after returning:
a rank that hands back its result and then dies (e.g. SIGABRT while the interpreter shuts down)
fails the run. Such worlds are spawned, not forked: a forked child leaves with ``os._exit`` and
never runs the interpreter shutdown where that abort happens.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import queue
import signal
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shardbench.harness.launch import forkserver_context
from shardbench.harness.nvml_check import drop_where_nvml_cannot_answer


class RankFailed(RuntimeError):
    """A rank raised (the message holds its traceback) or died."""


def describe_exit(code: int | None) -> str:
    """``exit code -6 (SIGABRT)`` for a process killed by a signal, ``exit code 1`` otherwise."""
    if code is not None and code < 0:
        try:
            return f"exit code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exit code {code}"


def _context() -> Any:
    """Process start method: a forkserver with torch preloaded. Forking from it is safe where
    forking the test process is not (it holds no threads, no process group, no open worlds)."""
    # one fork server per process: the launcher's, so both find it warm (torch, the
    # strategies, the worker, the tiny transformer's BERT, and what conftest.py's
    # ``import_for`` added); its imports take effect when the server starts (first use)
    return forkserver_context()


def _start_rank() -> None:
    """What a test rank sets first: one thread (N ranks share the 2 CI cores), and torch's NVML
    check off where NVML cannot load, as a rank of the worker has it (the fork server's imports
    may have switched it on, and a host without NVML would pay it at every device query; a rank
    the launcher forks gets its launcher's variables instead)."""
    torch.set_num_threads(1)
    drop_where_nvml_cannot_answer()


def _entry(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    store_path: str,
    timeout_s: float,
    results: Any,
    args: tuple[Any, ...],
) -> None:
    _start_rank()
    try:
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
        )
        out = fn(rank, world_size, *args)
        # Serialised by value: tensors sent as shared-memory handles would die with this process.
        buf = io.BytesIO()
        torch.save(out, buf)
        results.put((rank, "ok", buf.getvalue()))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 120.0, check_exit: bool = False
) -> list[Any]:
    """Run ``fn`` on ``world_size`` gloo ranks; return the per-rank results in rank order.
    ``check_exit``: also require every rank to exit with code 0 after returning its result."""
    ctx = mp.get_context("spawn") if check_exit else _context()
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="shardbench-dist-") as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [
            ctx.Process(
                target=_entry, args=(fn, r, world_size, store_path, timeout_s, results, args), daemon=True
            )
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        got: dict[int, Any] = {}
        try:
            while len(got) < world_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"{world_size - len(got)} of {world_size} ranks did not finish "
                        f"within {timeout_s:.0f}s (done: {sorted(got)})"
                    )
                try:
                    rank, status, payload = results.get(timeout=min(remaining, 1.0))
                except queue.Empty:
                    dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in got]
                    if dead:
                        code = procs[dead[0]].exitcode
                        raise RankFailed(f"rank {dead[0]} died with {describe_exit(code)}") from None
                    continue
                if status == "error":
                    raise RankFailed(f"rank {rank} failed:\n{payload}")
                got[rank] = torch.load(io.BytesIO(payload), weights_only=False)
        finally:
            # Finished worlds get a moment to exit cleanly (longer when the exit is checked:
            # interpreter shutdown is slow on busy cores); failed ones are killed at once, since
            # their surviving ranks are blocked in a collective with the dead one.
            grace = (30.0 if check_exit else 5.0) if len(got) == world_size else 0.5
            grace_end = time.monotonic() + grace
            for p in procs:
                p.join(timeout=max(0.0, grace_end - time.monotonic()))
            exited = [not p.is_alive() for p in procs]
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
    if check_exit:
        for r, (p, ok) in enumerate(zip(procs, exited, strict=True)):
            if not ok:
                raise RankFailed(f"rank {r} returned its result but did not exit within 30s")
            if p.exitcode != 0:
                raise RankFailed(f"rank {r} returned its result, then died with {describe_exit(p.exitcode)}")
    return [got[r] for r in range(world_size)]


def _simulated_entry(fn: Callable[..., Any], world_size: int, results: Any, args: tuple[Any, ...]) -> None:
    torch.set_num_threads(1)
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
        buf = io.BytesIO()
        torch.save(fn(0, world_size, *args), buf)
        results.put(("ok", buf.getvalue()))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put(("error", traceback.format_exc()))


def run_simulated(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 120.0) -> Any:
    """Run ``fn(0, world_size, *args)`` in one fresh process as rank 0 of a fake world of N
    (PyTorch's fake process group: collectives return at once and move no data)."""
    ctx = _context()
    results = ctx.Queue()
    proc = ctx.Process(target=_simulated_entry, args=(fn, world_size, results, args), daemon=True)
    proc.start()
    try:
        status, payload = results.get(timeout=timeout_s)
    except queue.Empty:
        raise TimeoutError(f"simulated rank did not finish within {timeout_s:.0f}s") from None
    finally:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
    if status == "error":
        raise RankFailed(f"simulated rank 0 failed:\n{payload}")
    return torch.load(io.BytesIO(payload), weights_only=False)


def _serve(rank: int, world_size: int, store_path: str, timeout_s: float, tasks: Any, results: Any) -> None:
    """A rank of a ``World``: run each task from ``tasks`` until ``None`` arrives."""
    _start_rank()
    try:
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
        )
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((-1, rank, "error", traceback.format_exc()))
        return
    while (task := tasks.get()) is not None:
        seq, fn, args = task
        try:
            buf = io.BytesIO()
            torch.save(fn(rank, world_size, *args), buf)
            results.put((seq, rank, "ok", buf.getvalue()))
        except BaseException:  # noqa: BLE001 - reported to the parent, which ends this world
            results.put((seq, rank, "error", traceback.format_exc()))
    dist.destroy_process_group()


class World:
    """``world_size`` gloo ranks that stay up and run one check after another (see the module
    docstring). A failed or timed-out check kills the world: ``run`` on it then raises."""

    def __init__(self, world_size: int, *, timeout_s: float = 300.0) -> None:
        self.world_size = world_size
        ctx = _context()
        self._tmp = tempfile.TemporaryDirectory(prefix="shardbench-world-")
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(world_size)]
        store_path = os.path.join(self._tmp.name, "store")
        self._procs = [
            ctx.Process(
                target=_serve,
                args=(r, world_size, store_path, timeout_s, self._tasks[r], self._results),
                daemon=True,
            )
            for r in range(world_size)
        ]
        for p in self._procs:
            p.start()
        self._seq = 0
        self.alive = True

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float = 120.0) -> list[Any]:
        """Run ``fn(rank, world_size, *args)`` on every rank; the per-rank results in rank order.
        ``timeout_s`` bounds this check (the world's start-up included, on first use)."""
        if not self.alive:
            raise RankFailed(f"world of {self.world_size} was closed after an earlier failure")
        self._seq += 1
        for q in self._tasks:
            q.put((self._seq, fn, args))
        deadline = time.monotonic() + timeout_s
        got: dict[int, Any] = {}
        ok = False
        try:
            while len(got) < self.world_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"{self.world_size - len(got)} of {self.world_size} ranks did not finish "
                        f"{getattr(fn, '__name__', fn)} within {timeout_s:.0f}s (done: {sorted(got)})"
                    )
                try:
                    seq, rank, status, payload = self._results.get(timeout=min(remaining, 1.0))
                except queue.Empty:
                    dead = [r for r, p in enumerate(self._procs) if p.exitcode is not None and r not in got]
                    if dead:
                        code = self._procs[dead[0]].exitcode
                        raise RankFailed(f"rank {dead[0]} died with exit code {code}") from None
                    continue
                if status == "error":
                    raise RankFailed(f"rank {rank} failed:\n{payload}")
                got[rank] = torch.load(io.BytesIO(payload), weights_only=False)
            ok = True
        finally:
            if not ok:  # the other ranks may be blocked in a collective with the failed one
                self.close(kill=True)
        return [got[r] for r in range(self.world_size)]

    def close(self, *, kill: bool = False) -> None:
        if not self.alive:
            return
        self.alive = False
        if not kill:
            for q in self._tasks:
                q.put(None)
            end = time.monotonic() + 5.0
            for p in self._procs:
                p.join(timeout=max(0.0, end - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join()
        self._tmp.cleanup()


_WORLDS: dict[int, World] = {}


def shared_world(world_size: int) -> World:
    """The session's world of ``world_size`` ranks, started now if there is none alive."""
    world = _WORLDS.get(world_size)
    if world is None or not world.alive:
        world = _WORLDS[world_size] = World(world_size)
    return world


def run_in_world(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 120.0) -> list[Any]:
    """``run_distributed``'s contract, on the session's shared world of ``world_size`` ranks."""
    return shared_world(world_size).run(fn, *args, timeout_s=timeout_s)


@atexit.register
def close_shared_worlds() -> None:
    while _WORLDS:
        _WORLDS.popitem()[1].close()


@contextlib.contextmanager
def fake_world(world_size: int) -> Iterator[None]:
    """This process as rank 0 of a fake world of ``world_size`` (collectives move no data)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    assert not dist.is_initialized(), "a process group is already initialised in this process"
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def run_simulated_here(fn: Callable[..., Any], world_size: int, *args: Any) -> Any:
    """``run_simulated``'s contract, in this process (no new process): ``fn(0, world_size, *args)``."""
    with fake_world(world_size):
        return fn(0, world_size, *args)
