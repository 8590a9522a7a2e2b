"""What an optimizer step over DTensors costs beyond one over plain tensors: the dispatch of each
of the update's ops through DTensor's sharding propagation, which FSDP2's optimizer pays for
every parameter it steps over (each is a DTensor shard).

That cost is not one figure per tensor. DTensor caches what it propagated for an op by the op,
its arguments' shapes and its scalars, and AdamW's scalars change at every step: within a step,
a tensor whose shape an earlier tensor had finds the propagation cached, and one of a new shape
propagates every op again, on a small CPU about ten times the cost. A model's own shapes, and
their order, decide how many ops miss. So the probe steps AdamW (the CPU's pinned
implementation) over DTensors of exactly the shapes the rank's optimizer steps over, in its
order, and over plain tensors of one element each: the difference is the DTensor dispatch, the
figure (``dispatch_seconds``). Each DTensor holds one element locally under the model's global
shape, so the update's element work (the update probe's term) is not measured twice and the
probe takes about a second even for a large model.

It runs in a process of its own: the DTensors need a process group, and the one it creates (a
single rank over an in-memory store) must not become the calling process's. One untimed step,
then ``REPEATS`` timed; the median. The mesh is one-dimensional, as FSDP2's is; hybrid sharding's
DTensors lie on two dimensions, whose propagation costs more, so its figure is a floor there.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

REPEATS = 5
#: the probe's own process: importing torch and creating the group take a few seconds, and six
#: steps over a thousand DTensors whose shapes never repeat about seven more
TIMEOUT_S = 120


def probe_dtensor_update(shapes: Sequence[Sequence[int]], threads: int) -> dict[str, Any]:
    """Measure a step over DTensors of ``shapes`` at ``threads``, in a process of its own:
    ``dispatch_seconds`` (a step over the DTensors, less one over as many plain tensors; never
    below zero), ``dtensor_seconds``, ``plain_seconds``, ``tensors``, ``distinct_shapes``,
    ``repeats``, ``threads``. A probe that fails or outlasts ``TIMEOUT_S`` raises a
    RuntimeError that says why in one line."""
    from shardbench.prediction.processes_at_once import run_at_once

    request = {"shapes": [list(s) for s in shapes], "threads": threads}
    return run_at_once("shardbench.prediction.dtensor_update_probe", request, 1, TIMEOUT_S)[0]


def _measure(shapes: list[tuple[int, ...]], threads: int) -> dict[str, Any]:
    """The probe itself, in its own process (see the module docstring)."""
    import torch
    import torch.distributed as dist

    from shardbench.metrics.kernels import pin_implementation

    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Replicate, Shard
    except ImportError as e:  # pragma: no cover - a torch without public DTensors
        raise SystemExit(f"this torch has no public DTensor API ({e})") from e

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))

    def as_dtensor(shape: tuple[int, ...]) -> torch.Tensor:
        size = torch.Size(shape)
        stride = torch.empty(size, device="meta").stride()
        placement = [Shard(0)] if shape else [Replicate()]
        local = torch.zeros(1) if shape else torch.zeros(())
        return DTensor.from_local(local, mesh, placement, run_check=False, shape=size, stride=stride)

    def step_seconds(tensors: list[torch.Tensor]) -> float:
        params = [torch.nn.Parameter(t) for t in tensors]
        for p in params:
            p.grad = torch.ones_like(p)
        optimizer = pin_implementation(torch.optim.AdamW(params, lr=1e-3), "cpu")
        optimizer.step()
        times = []
        for _ in range(REPEATS):
            started = time.perf_counter()
            optimizer.step()
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    try:
        dtensor = step_seconds([as_dtensor(s) for s in shapes])
        plain = step_seconds([torch.zeros(1) for _ in shapes])
    finally:
        dist.destroy_process_group()
    return {
        "dispatch_seconds": max(0.0, dtensor - plain),
        "dtensor_seconds": dtensor,
        "plain_seconds": plain,
        "tensors": len(shapes),
        "distinct_shapes": len(set(shapes)),
        "repeats": REPEATS,
        "threads": threads,
    }


def main() -> None:
    from shardbench.prediction.processes_at_once import answer, read_request

    request = read_request()
    shapes = [tuple(int(d) for d in s) for s in request["shapes"]]
    answer(_measure(shapes, int(request["threads"])))


if __name__ == "__main__":
    main()
