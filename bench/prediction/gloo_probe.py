"""A gloo probe: what each collective costs on this machine at a world size, fitted as a latency
per call plus bytes over a bandwidth (``network_profiles.LinkCost``); the step-time model's
``gloo`` network profile.

The method is fixed: ``world_size`` processes started afresh (spawn), a gloo group over a file
store, each at ``threads`` intra-op threads (what a rank of the run has). For each collective
kind and each size in ``SIZES`` (fp32 tensors, the full tensor's bytes), one untimed call, then
``REPEATS`` calls each timed alone between barriers on rank 0; the median is the size's time.
The fit is least squares of seconds against the bytes a ring sends per rank
(``metrics.analytic.RING``): the intercept is the latency, the slope's inverse the bandwidth. A kind gloo
cannot run here is left out (its collectives are costed at all-reduce's rates). On a 2-core CPU
it takes a few seconds; it runs once per machine, torch version, world size and threads, and is
cached in the results home (``probe_cache``: ``peaks/network.json``).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Any

#: full-tensor bytes per call measured: small enough to take seconds, large enough that the
#: bandwidth term dominates the largest
SIZES = (1 << 16, 1 << 21, 1 << 24)
REPEATS = 3
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")


def fit(points: list[tuple[float, float]]) -> dict[str, float]:
    """Least squares ``seconds = latency + sent / bandwidth`` over ``(sent bytes, seconds)``
    points; a negative intercept is read as no latency (the line through the origin instead)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    latency = my - slope * mx
    if latency < 0 or slope <= 0:
        latency = 0.0 if slope > 0 or latency < 0 else latency
        slope = sum(x * y for x, y in points) / sum(x * x for x in xs)
    return {"latency_s": latency, "bandwidth": 1 / slope if slope > 0 else float("inf")}


def _call(kind: str, dist: Any, torch: Any, nbytes: int, world_size: int) -> Any:
    """A callable that issues one ``kind`` collective of ``nbytes`` full-tensor bytes."""
    elements = max(world_size, nbytes // 4 // world_size * world_size)
    full = torch.ones(elements)
    part = torch.ones(elements // world_size)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(full)
    if kind == "all_gather":
        return lambda: dist.all_gather_into_tensor(full, part)
    if kind == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(part, full)
    if kind == "broadcast":
        return lambda: dist.broadcast(full, src=0)
    return lambda: dist.reduce(full, dst=0)


def _rank(rank: int, world_size: int, threads: int, store: str, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    out: dict[str, list[tuple[int, float]]] = {}
    try:
        for kind in KINDS:
            points = []
            for nbytes in SIZES:
                try:
                    call = _call(kind, dist, torch, nbytes, world_size)
                    call()
                except (RuntimeError, ValueError):  # gloo lacks the kind here: every rank alike
                    break
                times = []
                for _ in range(REPEATS):
                    dist.barrier()
                    started = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - started)
                points.append((nbytes, statistics.median(times)))
            if points:
                out[kind] = points
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        queue.put(out)


def probe(world_size: int, threads: int) -> dict[str, Any]:
    """Measure (see the module docstring): per kind, ``latency_s``, ``bandwidth`` (bytes per
    second sent per rank) and the ``points`` measured (full bytes, median seconds); and
    ``seconds``, the probe's wall time."""
    import multiprocessing

    from shardbench.metrics.analytic import RING

    if world_size < 2:
        raise ValueError(f"a gloo probe needs at least 2 ranks, got {world_size}")
    started = time.perf_counter()
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited thread pools
    queue = context.Queue()
    with tempfile.TemporaryDirectory(prefix="shardbench-gloo-probe-") as tmp:
        store = os.path.join(tmp, "store")
        procs = [
            context.Process(target=_rank, args=(r, world_size, threads, store, queue), daemon=True)
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        try:
            measured = queue.get(timeout=120)
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
    kinds = {}
    for kind, points in measured.items():
        sent = [(RING[kind](world_size) * b, t) for b, t in points]
        kinds[kind] = {**fit(sent), "points": [list(p) for p in points]}
    return {"kinds": kinds, "seconds": time.perf_counter() - started}
