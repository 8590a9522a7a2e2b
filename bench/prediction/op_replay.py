"""One rank's compute time, measured op by op: every operator call its training step dispatches
(``op_calls``: recorded during the FLOP count, under fake tensors, nothing computed) is replayed,
each distinct call once, on real tensors on this device, and timed.

    compute = sum over distinct calls of (times the step makes it x its median replayed time)

Why op by op: a step's FLOPs say how much matrix work it does, not how long the rest takes.
Softmax over a 1024-token score matrix, normalisation, GELU, dropout, the loss, the copies and
views autograd adds, and eager PyTorch's cost per op run far below a GEMM's rate, and their share
differs by model: one efficiency against the GEMM peak cannot fit a base transformer and Image
GPT at once. Replaying the step's own operators at the rank's threads measures all of it, on any
model, without building or running the model: a layer repeated 24 times is one set of distinct
calls, so a replay costs about one layer's compute times the repeats.

What it leaves out: the autograd engine's bookkeeping between ops; the memory a step's
activations grow into (a replayed call reuses memory its previous repeat freed and finds its
inputs in cache, where a step's kernel faults in fresh pages and reads activations written long
before, so memory-bound ops on large activations replay faster than they run); and the values
(floating inputs are uniform in [0, 1); integer ones, unless recorded, zeros, a valid index
anywhere, or ones where zeros are refused: a call whose work follows an integer input's values,
such as a packed LSTM's batch sizes, is timed right only where the count ran on real tensors and
recorded them). A call fresh tensors cannot make is counted out (``unreplayed_calls``), never
guessed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from shardbench.prediction.op_calls import Named, OpCall, TensorDesc, dtype_of

#: one distinct call: up to this many timed repeats after a warm-up, fewer past the budget
REPEATS = 5
BUDGET_S = 0.02
#: the values integer inputs are given, tried in turn
INTEGER_FILLS = (0, 1)
#: a whole replay's time: the calls not reached by then count as not replayed, so a step too
#: large to replay in time falls back to its FLOPs (``record_step_time.replay_usable``)
TOTAL_BUDGET_S = 120.0


def materialize(x: Any, device: str | None = None, integers: int = 0) -> Any:
    """A described argument (``op_calls.describe``) rebuilt with real data: a tensor of the
    recorded strides over storage of the size they reach (an expanded view's stride 0 reaches
    one element per row), floating values uniform in [0, 1), integer ones all ``integers``."""
    if isinstance(x, TensorDesc):
        return _tensor(x, device, integers)
    if isinstance(x, (list, tuple)):
        return type(x)(materialize(v, device, integers) for v in x)
    if isinstance(x, Named):
        return _named(x, device)
    return x


def _tensor(desc: TensorDesc, device: str | None, integers: int) -> torch.Tensor:
    dtype = dtype_of(desc.dtype)
    dev = torch.device(device or desc.device)
    if desc.values is not None:  # recorded as they were (``op_calls``): contiguous
        return torch.tensor(desc.values, dtype=dtype, device=dev).reshape(desc.shape)
    size = desc.reach()
    if dtype.is_floating_point or dtype.is_complex:
        base = torch.rand(size, dtype=dtype, device=dev)
    else:
        base = torch.full((size,), integers, dtype=dtype, device=dev)
    return base.as_strided(desc.shape, desc.stride)


def _named(x: Named, device: str | None) -> Any:
    if x.kind == "float":
        return float(x.name)
    if x.kind == "dtype":
        return dtype_of(x.name)
    if x.kind == "device":
        return torch.device(device or x.name)
    if x.kind in ("layout", "memory_format"):
        return getattr(torch, x.name)
    return None  # opaque: not data


def operator(name: str) -> Any:
    """``aten.mul.Tensor`` -> ``torch.ops.aten.mul.Tensor``."""
    namespace, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _time_call(func: Any, args: list[Any], kwargs: dict[str, Any], device: str) -> float:
    func(*args, **kwargs)  # warm-up: a shape's first call pays its one-off set-up
    _sync(device)
    times: list[float] = []
    while not times or (len(times) < REPEATS and sum(times) < BUDGET_S):
        t0 = time.perf_counter()
        func(*args, **kwargs)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def replay(
    calls: Sequence[OpCall], *, threads: int | None = None, device: str | None = None, copies: int = 1
) -> dict[str, Any]:
    """Each distinct call of a step (``op_calls``) timed on real tensors at ``threads``
    (the rank's), on ``device`` (default: each call's own), in ``copies`` threads at once: the
    ranks of a cell that share a host compete for its caches and memory bandwidth, so a rank's
    compute is measured beside the others'. Returns the compute ``seconds`` (the slowest copy's,
    as the slowest rank paces a step), each copy's, the step's ``calls``, the ``distinct`` calls,
    the ``unreplayed_calls`` and how long the replay took (``replay_s``)."""
    from shardbench.prediction.at_once import at_once

    started = time.perf_counter()

    def one(_: int, together: Callable[[], None]) -> tuple[float, int]:
        together()
        return _replay_once(calls, device, started + TOTAL_BUDGET_S)

    results = at_once(one, copies, threads)
    per_copy = [seconds for seconds, _ in results]
    return {
        "seconds": max(per_copy),
        "seconds_per_copy": per_copy,
        "copies": copies,
        "calls": sum(c.count for c in calls),
        "distinct": len(calls),
        "unreplayed_calls": max(unreplayed for _, unreplayed in results),
        "replay_s": time.perf_counter() - started,
    }


def _replay_once(calls: Sequence[OpCall], device: str | None, deadline: float) -> tuple[float, int]:
    """One copy's replay: its compute seconds and the calls it could not make (or did not reach
    by ``deadline``)."""
    seconds, unreplayed = 0.0, 0
    with torch.no_grad():
        for call in calls:
            if time.perf_counter() > deadline:
                unreplayed += call.count
                continue
            once = _time_once(call, device)
            if once is None:
                unreplayed += call.count
            else:
                seconds += call.count * once
    return seconds, unreplayed


def _time_once(call: OpCall, device: str | None) -> float | None:
    """One call's median time, or None where fresh tensors cannot make it. Integer inputs not
    recorded with their values are zeros, a valid index anywhere; a call that refuses them
    (lengths must be positive) is tried with ones."""
    dev = device or _first_device(call.args) or "cpu"
    for integers in INTEGER_FILLS:
        try:
            args = materialize(call.args, device, integers)
            kwargs = {k: materialize(v, device, integers) for k, v in call.kwargs.items()}
            return _time_call(operator(call.operator), list(args), kwargs, dev)
        except Exception:  # noqa: BLE001 - a call fresh tensors cannot make is counted out
            args = kwargs = None  # the failed try's tensors go before the next
    return None


def _first_device(args: Any) -> str | None:
    if isinstance(args, TensorDesc):
        return args.device
    values = args.values() if isinstance(args, dict) else args if isinstance(args, (list, tuple)) else ()
    for v in values:
        if (d := _first_device(v)) is not None:
            return d
    return None
