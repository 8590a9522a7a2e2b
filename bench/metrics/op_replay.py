"""One rank's compute time, measured op by op: every operator its training step dispatches is
recorded once with its arguments' shapes (during the FLOP count, under fake tensors: nothing
computed), then each distinct call is replayed on real tensors on this device and timed.

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
(floating inputs are uniform in [0, 1), integer ones zeros, a valid index anywhere, or ones where
zeros are refused). A call fresh tensors cannot make is counted out (``unreplayed_calls``), never
guessed.

The trace is plain JSON (``OpTrace.to_json``), so a rank can hand it to the launcher, which
replays it once the ranks have ended and the cores are free.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: one distinct call: up to this many timed repeats after a warm-up, fewer past the budget
REPEATS = 5
BUDGET_S = 0.02
#: the values integer inputs are given, tried in turn
INTEGER_FILLS = (0, 1)


def encode(x: Any) -> Any:
    """An argument as JSON: a tensor by its shape, strides, dtype and device; scalars as
    themselves (a non-finite float as its name); lists and tuples kept apart."""
    if isinstance(x, torch.Tensor):
        return {"t": [list(x.shape), list(x.stride()), str(x.dtype).removeprefix("torch."), x.device.type]}
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else {"float": repr(x)}
    if isinstance(x, list):
        return {"list": [encode(v) for v in x]}
    if isinstance(x, tuple):
        return {"tuple": [encode(v) for v in x]}
    if isinstance(x, torch.dtype):
        return {"dtype": str(x).removeprefix("torch.")}
    if isinstance(x, torch.device):
        return {"device": x.type}
    if isinstance(x, torch.layout):
        return {"layout": str(x).removeprefix("torch.")}
    if isinstance(x, torch.memory_format):
        return {"memory_format": str(x).removeprefix("torch.")}
    return {"opaque": type(x).__name__}  # not data (a generator): replayed as None


class OpTrace(TorchDispatchMode):
    """Counts each distinct operator call of the pass it is active over, by its operator and
    its arguments as ``encode`` writes them."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        try:
            key = json.dumps([str(func), encode(list(args)), {k: encode(v) for k, v in kwargs.items()}])
        except Exception:  # noqa: BLE001 - a layout without strides: kept, and replayed as unreplayable
            key = json.dumps([str(func), [{"opaque": "unrecorded"}], {}])
        self.calls[key] += 1
        return func(*args, **kwargs)

    def to_json(self) -> list[list[Any]]:
        """``[[operator, args, kwargs, count], ...]``, in a fixed order."""
        return [[*json.loads(k), n] for k, n in sorted(self.calls.items())]


def signature(trace: list[list[Any]]) -> str:
    """A digest of a trace's calls and counts: two steps with the same digest replay alike."""
    return hashlib.sha256(json.dumps(trace, sort_keys=True).encode()).hexdigest()[:16]


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def _reach(shape: list[int], stride: list[int]) -> int:
    """The elements of storage a view of ``shape`` and ``stride`` reaches."""
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) if all(shape) else 0


def decode(x: Any, device: str | None = None, integers: int = 0) -> Any:
    """``encode``'s argument rebuilt with real data: a tensor of the recorded strides over
    storage of the size they reach (an expanded view's stride 0 reaches one element per row),
    floating values uniform in [0, 1), integer ones all ``integers``."""
    if not isinstance(x, dict):
        return x
    if "t" in x:
        shape, stride, dtype_name, recorded = x["t"]
        dtype = _dtype(dtype_name)
        dev = torch.device(device or recorded)
        size = _reach(shape, stride)
        if dtype.is_floating_point or dtype.is_complex:
            base = torch.rand(size, dtype=dtype, device=dev)
        else:
            base = torch.full((size,), integers, dtype=dtype, device=dev)
        return base.as_strided(shape, stride)
    if "float" in x:
        return float(x["float"])
    if "list" in x:
        return [decode(v, device, integers) for v in x["list"]]
    if "tuple" in x:
        return tuple(decode(v, device, integers) for v in x["tuple"])
    if "dtype" in x:
        return _dtype(x["dtype"])
    if "device" in x:
        return torch.device(device or x["device"])
    if "layout" in x:
        return getattr(torch, x["layout"])
    if "memory_format" in x:
        return getattr(torch, x["memory_format"])
    return None


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
    trace: list[list[Any]], *, threads: int | None = None, device: str | None = None, copies: int = 1
) -> dict[str, Any]:
    """Each distinct call of ``trace`` (``OpTrace.to_json``) timed on real tensors at ``threads``
    (the rank's), on ``device`` (default: each call's own), in ``copies`` threads at once: the
    ranks of a cell that share a host compete for its caches and memory bandwidth, so a rank's
    compute is measured beside the others'. Returns the compute ``seconds`` (the slowest copy's,
    as the slowest rank paces a step), each copy's, the step's ``calls``, the ``distinct`` calls,
    the ``unreplayed_calls`` and how long the replay took (``replay_s``)."""
    from shardbench.metrics.at_once import at_once

    started = time.perf_counter()

    def one(index: int, together: Callable[[], None]) -> tuple[float, int]:
        together()
        return _replay_once(trace, device)

    results = at_once(one, copies, threads)
    per_copy = [seconds for seconds, _ in results]
    return {
        "seconds": max(per_copy),
        "seconds_per_copy": per_copy,
        "copies": copies,
        "calls": sum(n for *_, n in trace),
        "distinct": len(trace),
        "unreplayed_calls": results[0][1],
        "replay_s": time.perf_counter() - started,
    }


def _replay_once(trace: list[list[Any]], device: str | None) -> tuple[float, int]:
    """One copy's replay: its compute seconds and the calls it could not make. Integer inputs are
    zeros, a valid index anywhere; a call that refuses them (lengths must be positive: CTC loss,
    packed sequences) is tried with ones."""
    seconds, unreplayed = 0.0, 0
    with torch.no_grad():
        for name, args, kwargs, count in trace:
            dev = device or _first_device(args) or "cpu"
            for integers in INTEGER_FILLS:
                try:
                    real_args = decode(args, device, integers)
                    real_kwargs = {k: decode(v, device, integers) for k, v in kwargs.items()}
                    seconds += count * _time_call(operator(name), real_args, real_kwargs, dev)
                    break
                except Exception:  # noqa: BLE001 - a call fresh tensors cannot make is counted out
                    real_args = real_kwargs = None
            else:
                unreplayed += count
    return seconds, unreplayed


def largest_call_bytes(trace: list[list[Any]]) -> int:
    """The most bytes one call's tensor arguments take: what replaying it allocates at least."""

    def nbytes(x: Any) -> int:
        if isinstance(x, dict) and "t" in x:
            shape, stride, dtype_name, _ = x["t"]
            return _reach(shape, stride) * _dtype(dtype_name).itemsize
        if isinstance(x, dict):
            return sum(nbytes(v) for v in x.values() if isinstance(v, (list, dict)))
        if isinstance(x, list):
            return sum(nbytes(v) for v in x)
        return 0

    return max((nbytes(args) + nbytes(kwargs) for _, args, kwargs, _ in trace), default=0)


def _first_device(args: Any) -> str | None:
    if isinstance(args, dict) and "t" in args:
        return args["t"][3]
    values = args.values() if isinstance(args, dict) else args if isinstance(args, list) else ()
    for v in values:
        if (d := _first_device(v)) is not None:
            return d
    return None
