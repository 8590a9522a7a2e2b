"""A gloo probe: what each collective costs on this machine at a world size, fitted as a latency
per call plus bytes over a bandwidth (``network_profiles.LinkCost``); the step-time model's
``gloo`` network profile.

The method is fixed: ``world_size`` processes started afresh (spawn), a gloo group over a file
store, each at ``threads`` intra-op threads and bound as a rank of the run is (``core_binding``:
its compute on its cores, its group's threads on any). For each collective
kind and each size in ``SIZES`` (fp32 tensors, the full tensor's bytes), one untimed call, then
``REPEATS[size]`` calls each timed alone between barriers on rank 0; their low quartile is the
size's time. A call between barriers takes either its cost or its cost and a stall of a few
milliseconds, which come in bursts when the host runs other work (a shared virtual machine's
cores are taken away for a few milliseconds at a time): the low quartile reads the cost even in
a burst, where the median would read the stall. The stalls a step meets are in the in-step
figure below, timed in steps. The small sizes take the most calls: the fitted latency rests on
them.
The fit is least squares of seconds against the bytes a ring sends per rank
(``metrics.analytic.RING``): the intercept is the latency, the slope's inverse the bandwidth. A kind gloo
cannot run here is left out (its collectives are costed at all-reduce's rates).

A call timed between barriers is the cheapest a call gets: the ranks arrive together and the
group's threads are awake. Inside a training step neither holds. Each rank reaches the call
when its own compute ends, a little apart from the others, so every call waits for the last to
arrive, and on a CPU the group's threads must first win a core back from the compute. So the
probe also times steps the way the harness does (``in_step``): ``IN_STEP_STEPS`` steps of a fixed
compute, each rank's steps back to back, a step's time its slowest rank's and the median the
figure, once with the compute alone and once split into ``IN_STEP_CALLS`` parts, each followed
by a small all-reduce. What the calls add, per call, beyond such a call's cost by the fitted
all-reduce line (its barrier-aligned time) is the profile's ``in_step_call_s``, which the
step-time model adds for every call a step makes: the model's cost of a call in a step is then
what the steps measured.

On a 2-core CPU it takes a few seconds; it runs once per machine, torch version, world size,
threads and rank binding, and is cached in the results home (``probe_cache``:
``peaks/network.json``).

The two-tier gloo profile (``gloo_tiers``) probes the same way with the world split into
groups that all run their collective at once, as a hybrid-sharded step's groups do: ``within``,
the "nodes" of ``ranks_per_node`` consecutive ranks; ``across``, one rank of each node. On one
machine both tiers are the same loopback, but a group's collective shares the cores with the
other groups' (a lone probe at the group's size would not see them).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Any

from shardbench.metrics.topology import replica_group_ranks, shard_group_ranks
from shardbench.prediction.network_profiles import LinkCost

#: full-tensor bytes per call measured: small enough to take seconds, large enough that the
#: bandwidth term dominates the largest
SIZES = (1 << 16, 1 << 21, 1 << 24)
#: timed calls per size (every rank makes as many: the counts are fixed, not timed): about a
#: tenth of a second of calls at each size on a 2-core CPU
REPEATS = {1 << 16: 25, 1 << 21: 11, 1 << 24: 5}
#: timed calls of a size ``REPEATS`` does not name (a test's smaller ones)
OTHER_REPEATS = 5
#: the in-step measurement: the calls a step is split by, its compute (about a millisecond
#: between calls, the order of a small model's buckets and units), the steps timed after
#: ``IN_STEP_WARMUP`` untimed ones, and the full-tensor bytes of each call (a latency-bound size)
IN_STEP_CALLS = 8
IN_STEP_COMPUTE_S = 0.008
IN_STEP_STEPS = 40
IN_STEP_WARMUP = 5
IN_STEP_BYTES = 1 << 16
#: the kinds timed: torch's collectives, and ``reduce_to_owners``, a tensor's chunks each reduced
#: to its own rank by calls issued back to back and waited together (our ZeRO's reducer on gloo
#: from ``GLOO_REDUCE_FROM`` ranks): the calls run at once, so they cost less than as many lone
#: reduces
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "reduce_to_owners")


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


TIERS = ("within", "across")


def tier_groups(world_size: int, ranks_per_node: int, tier: str) -> list[list[int]]:
    """The groups probed at once for ``tier``: the nodes (``within``: ``ranks_per_node``
    consecutive ranks each) or one rank of each node (``across``)."""
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {', '.join(TIERS)}, got {tier!r}")
    if ranks_per_node < 1 or world_size % ranks_per_node:
        raise ValueError(f"{ranks_per_node} ranks a node do not divide {world_size} ranks")
    # a node's ranks are a shard group of width G; one rank of each node, its replica group
    if tier == "within":
        return [
            shard_group_ranks(first, world_size, ranks_per_node)
            for first in range(0, world_size, ranks_per_node)
        ]
    return [replica_group_ranks(local, world_size, ranks_per_node) for local in range(ranks_per_node)]


def _call(kind: str, dist: Any, torch: Any, nbytes: int, ranks: list[int] | None, group: Any) -> Any:
    """A callable that issues one ``kind`` collective of ``nbytes`` full-tensor bytes over
    ``group`` (None: the whole world, whose ``ranks`` are None)."""
    size = len(ranks) if ranks else dist.get_world_size()
    root = ranks[0] if ranks else 0
    elements = max(size, nbytes // 4 // size * size)
    full = torch.ones(elements)
    part = torch.ones(elements // size)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if kind == "all_gather":
        return lambda: dist.all_gather_into_tensor(full, part, group=group)
    if kind == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(part, full, group=group)
    if kind == "broadcast":
        return lambda: dist.broadcast(full, src=root, group=group)
    if kind == "reduce_to_owners":
        owners = ranks or list(range(size))
        chunk = elements // size

        def to_owners() -> None:
            works = [
                dist.reduce(full[i * chunk : (i + 1) * chunk], dst=owner, group=group, async_op=True)
                for i, owner in enumerate(owners)
            ]
            for work in works:
                work.wait()

        return to_owners
    return lambda: dist.reduce(full, dst=root, group=group)


def in_step(
    dist: Any, torch: Any, ranks: list[int] | None, group: Any, timed_steps: int = IN_STEP_STEPS
) -> dict[str, float]:
    """Steps timed as the harness times them (the module docstring): ``compute_s``, the median
    step of compute alone, and ``with_calls_s``, of the same compute split by ``calls``
    all-reduces of ``IN_STEP_BYTES``, over ``timed_steps`` steps each. Every rank of ``group``
    calls it together."""
    size = len(ranks) if ranks else dist.get_world_size()
    root = ranks[0] if ranks else 0
    a, buf = torch.randn(96, 96), torch.randn(1 << 16)

    def work(units: int) -> None:  # a matrix product and a pass over memory, as a step's ops
        for _ in range(units):
            torch.mm(a, a)
            buf.mul_(1.0)

    started, units = time.perf_counter(), 0
    while time.perf_counter() - started < 0.05:
        work(1)
        units += 1
    # the group's first rank sets the compute: every rank then does the same work
    per_step = torch.tensor([max(IN_STEP_CALLS, round(IN_STEP_COMPUTE_S * units / 0.05))], dtype=torch.int64)
    dist.broadcast(per_step, src=root, group=group)
    part = int(per_step) // IN_STEP_CALLS
    call = _call("all_reduce", dist, torch, IN_STEP_BYTES, ranks, group)

    def steps(calls: int) -> list[float]:
        dist.barrier(group=group)
        times = []
        for _ in range(IN_STEP_WARMUP + timed_steps):
            begun = time.perf_counter()
            if calls:
                for _ in range(calls):
                    work(part)
                    call()
            else:
                work(part * IN_STEP_CALLS)
            times.append(time.perf_counter() - begun)
        return times[IN_STEP_WARMUP:]

    mine = torch.tensor(steps(0) + steps(IN_STEP_CALLS), dtype=torch.float64)
    everyone = torch.empty(size * mine.numel(), dtype=torch.float64)
    dist.all_gather_into_tensor(everyone, mine, group=group)
    slowest = everyone.reshape(size, -1).max(dim=0).values.tolist()  # per step, as the harness
    return {
        "compute_s": statistics.median(slowest[:timed_steps]),
        "with_calls_s": statistics.median(slowest[timed_steps:]),
        "calls": IN_STEP_CALLS,
        "bytes": IN_STEP_BYTES,
    }


def per_call_in_step(
    measured: dict[str, float], all_reduce: dict[str, float], ring_size: int
) -> dict[str, float]:
    """``measured`` (``in_step``) with ``seconds_per_call``: what each call added to the steps
    beyond ``aligned_call_s``, the cost the fitted all-reduce profile gives such a call (so that
    the model's cost of a call in a step, the profile's and this, is what the steps measured);
    never below zero."""
    aligned = LinkCost(all_reduce["latency_s"], all_reduce["bandwidth"]).seconds(
        "all_reduce", measured["bytes"], 1, ring_size
    )
    added = (measured["with_calls_s"] - measured["compute_s"]) / measured["calls"]
    return {**measured, "aligned_call_s": aligned, "seconds_per_call": max(0.0, added - aligned)}


def _my_group(dist: Any, rank: int, groups: list[list[int]] | None) -> tuple[list[int] | None, Any]:
    """This rank's group of ``groups`` and its ranks (every rank creates every group, in order,
    as ``new_group`` requires); the world where ``groups`` is None."""
    if groups is None:
        return None, None
    mine: tuple[list[int] | None, Any] = (None, None)
    for ranks in groups:
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = (ranks, group)
    return mine


def _rank(
    rank: int,
    world_size: int,
    threads: int,
    store: str,
    queue: Any,
    groups: list[list[int]] | None,
    sizes: tuple[int, ...],
    cores: tuple[int, ...] | None,
    in_step_steps: int,
) -> None:
    import torch
    import torch.distributed as dist

    from shardbench.core_binding import bind_process, leave_comm_threads_free, own_cpus

    if cores:  # as a run's rank: its compute on its cores, its group's threads on any
        shared = own_cpus()
        bind_process(cores)
        leave_comm_threads_free(shared)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    out: dict[str, list[tuple[int, float]]] = {}
    try:
        ranks, group = _my_group(dist, rank, groups)
        for kind in KINDS:
            points = []
            for nbytes in sizes:
                try:
                    call = _call(kind, dist, torch, nbytes, ranks, group)
                    call()
                except (RuntimeError, ValueError):  # gloo lacks the kind here: every rank alike
                    break
                times = []
                for _ in range(REPEATS.get(nbytes, OTHER_REPEATS)):
                    dist.barrier()
                    started = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - started)
                points.append((nbytes, statistics.quantiles(times, n=4, method="inclusive")[0]))
            if points:
                out[kind] = points
        calls = in_step(dist, torch, ranks, group, in_step_steps)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        queue.put({"kinds": out, "in_step": calls})


def probe(
    world_size: int,
    threads: int,
    groups: list[list[int]] | None = None,
    sizes: tuple[int, ...] = SIZES,
    in_step_steps: int = IN_STEP_STEPS,
) -> dict[str, Any]:
    """Measure (see the module docstring): per kind, ``latency_s``, ``bandwidth`` (bytes per
    second sent per rank) and the ``points`` measured (full bytes, low-quartile seconds);
    ``in_step``, what a call adds inside a step (``per_call_in_step``); and ``seconds``, the
    probe's wall time. With ``groups`` (equal sizes, covering the world) each group runs its
    collectives at once with the others, timed on rank 0's group. ``sizes``: the full-tensor
    bytes measured, and ``in_step_steps`` the steps timed in a step (a test's fewer check the
    method, not the machine)."""
    import multiprocessing

    from shardbench.core_binding import cores_of
    from shardbench.metrics.analytic import RING

    if world_size < 2:
        raise ValueError(f"a gloo probe needs at least 2 ranks, got {world_size}")
    if groups and len(groups[0]) < 2:
        raise ValueError(f"a gloo probe's groups need at least 2 ranks each, got {groups}")
    started = time.perf_counter()
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited thread pools
    queue = context.Queue()
    with tempfile.TemporaryDirectory(prefix="shardbench-gloo-probe-") as tmp:
        store = os.path.join(tmp, "store")
        procs = [
            context.Process(
                target=_rank,
                args=(
                    r,
                    world_size,
                    threads,
                    store,
                    queue,
                    groups,
                    sizes,
                    cores_of(r, world_size),
                    in_step_steps,
                ),
                daemon=True,
            )
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
    ring_size = len(groups[0]) if groups else world_size
    kinds = {}
    for kind, points in measured["kinds"].items():
        sent = [(RING[kind](ring_size) * b, t) for b, t in points]
        kinds[kind] = {**fit(sent), "points": [list(p) for p in points]}
    line = kinds.get("all_reduce") or {"latency_s": 0.0, "bandwidth": float("inf")}
    calls = per_call_in_step(measured["in_step"], line, ring_size)
    return {"kinds": kinds, "in_step": calls, "seconds": time.perf_counter() - started}
