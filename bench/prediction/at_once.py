"""Run one measurement as several copies at once, one thread each: the ranks of a cell that share
a host compete for its caches and memory bandwidth, so a rank's compute or optimizer update is
measured beside the others' (``op_replay``, ``update_probe``). torch releases the GIL inside its
kernels, so the copies' kernels run in parallel as the ranks' processes would. Each copy is
bound to the cores its rank would be (``core_binding``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def at_once(work: Callable[[int, Callable[[], None]], T], copies: int, threads: int | None) -> list[T]:
    """``work(index, together)`` in ``copies`` threads at ``threads`` intra-op threads (restored
    after), each result in order. ``together()`` waits until every copy reaches it, so the
    copies' timed parts start at once. A copy that raises breaks the wait for the others (none
    waits forever) and its exception is raised here."""
    import torch

    from shardbench.core_binding import bind_thread, cores_of, own_cpus

    barrier = threading.Barrier(copies)
    cpus = own_cpus()
    results: list[Any] = [None] * copies
    errors: list[BaseException] = []

    def one(index: int) -> None:
        try:
            if cores := cores_of(index, copies, cpus):
                bind_thread(cores)  # this thread only: the caller's own stays as it was
            results[index] = work(index, barrier.wait)
        except BaseException as e:  # noqa: BLE001 - raised in the caller below
            errors.append(e)
            barrier.abort()

    before = torch.get_num_threads()
    try:
        if threads:
            torch.set_num_threads(threads)
        workers = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(copies)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        torch.set_num_threads(before)
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real or errors:
        raise (real or errors)[0]
    return results
