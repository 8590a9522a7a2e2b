"""Run a function on N gloo ranks on the CPU, for distributed tests.

Each rank is a spawned process joined through a FileStore in a temporary directory (no network
ports to collide). Every wait is bounded: a rank that raises has its traceback re-raised in the
parent, and a world that does not finish within ``timeout_s`` is killed and reported, never left
hanging. ``fn(rank, world_size, *args)`` must be a module-level (picklable) function; its return
value comes back to the parent, one per rank. With ``check_exit=True`` a rank must also exit
cleanly after returning: a rank that hands back its result and then dies (e.g. SIGABRT while the
interpreter shuts down) fails the run.
"""

from __future__ import annotations

import io
import os
import queue
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


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


def _entry(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    store_path: str,
    timeout_s: float,
    results: Any,
    args: tuple[Any, ...],
) -> None:
    torch.set_num_threads(1)  # N ranks share the 2 CI cores
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
    ctx = mp.get_context("spawn")
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
    ctx = mp.get_context("spawn")
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
