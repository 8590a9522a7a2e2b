"""The operator calls of one training step, recorded for the op replay (``op_replay``): every
aten call the step's forward and backward dispatch, with its arguments' shapes, strides, dtypes
and devices, counted by distinct call, as plain JSON (``OpTrace.to_json``) so that a rank can
hand it to the process that replays it.

Recorded during the FLOP count (``flops.py``), usually under fake tensors: nothing is computed.
Where the count runs on real tensors (a workload whose shapes depend on its data), small integer
and boolean tensors are recorded with their values (``VALUES_UP_TO`` elements): their values
are what the call's work depends on (an LSTM's ``batch_sizes``, a CTC loss's lengths, a mask),
so the replay rebuilds them as they were. Under fake tensors no value is known.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from typing import Any

import torch

try:
    from torch.utils._python_dispatch import TorchDispatchMode
except ImportError as e:  # a private module: name what is missing
    raise RuntimeError(
        f"torch {torch.__version__} has no torch.utils._python_dispatch.TorchDispatchMode; "
        "recording a step's operator calls needs it"
    ) from e

#: integer and boolean tensors up to this many elements keep their values (real tensors only)
VALUES_UP_TO = 4096


def _is_fake(x: torch.Tensor) -> bool:
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:
        return False
    return isinstance(x, FakeTensor)


def encode(x: Any) -> Any:
    """An argument as JSON: a tensor by its shape, strides, dtype and device (and its values,
    see the module docstring); scalars as themselves (a non-finite float as its name); lists and
    tuples kept apart."""
    if isinstance(x, torch.Tensor):
        out: dict[str, Any] = {
            "t": [list(x.shape), list(x.stride()), str(x.dtype).removeprefix("torch."), x.device.type]
        }
        exact = not (x.dtype.is_floating_point or x.dtype.is_complex)
        if exact and x.numel() <= VALUES_UP_TO and x.device.type != "meta" and not _is_fake(x):
            out["values"] = x.detach().cpu().reshape(-1).tolist() if x.numel() else []
        return out
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


def tensor_bytes(x: Any) -> int:
    """The bytes of the tensors in ``x``: an encoded argument (the storage its strides reach),
    or a call's real or fake output."""
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, dict) and "t" in x:
        shape, stride, dtype_name, _ = x["t"]
        return reach(shape, stride) * dtype_of(dtype_name).itemsize
    values = x.values() if isinstance(x, dict) else x if isinstance(x, (list, tuple)) else ()
    return sum(tensor_bytes(v) for v in values)


def reach(shape: list[int], stride: list[int]) -> int:
    """The elements of storage a view of ``shape`` and ``stride`` reaches."""
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) if all(shape) else 0


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


class OpTrace(TorchDispatchMode):
    """Counts each distinct operator call of the pass it is active over, by its operator and
    its arguments as ``encode`` writes them, and keeps each call's output bytes (what replaying
    it allocates besides its inputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()
        self.output_bytes: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        try:
            key = json.dumps([str(func), encode(list(args)), {k: encode(v) for k, v in kwargs.items()}])
        except Exception:  # noqa: BLE001 - a layout without strides: kept, and replayed as unreplayable
            key = json.dumps([str(func), [{"opaque": "unrecorded"}], {}])
        out = func(*args, **kwargs)
        self.calls[key] += 1
        if key not in self.output_bytes:
            try:
                self.output_bytes[key] = tensor_bytes(out)
            except Exception:  # noqa: BLE001 - an output without storage counts as none
                self.output_bytes[key] = 0
        return out

    def to_json(self) -> list[list[Any]]:
        """``[[operator, args, kwargs, count, output bytes], ...]``, in a fixed order."""
        return [[*json.loads(k), n, self.output_bytes.get(k, 0)] for k, n in sorted(self.calls.items())]


def signature(trace: list[list[Any]]) -> str:
    """A digest of a trace's calls and counts: two steps with the same digest replay alike."""
    return hashlib.sha256(json.dumps(trace, sort_keys=True).encode()).hexdigest()[:16]


def largest_call_bytes(trace: list[list[Any]]) -> int:
    """The most bytes one call's tensors take, its inputs and its output: what replaying it
    allocates at least."""
    return max(
        (tensor_bytes(args) + tensor_bytes(kwargs) + out for _, args, kwargs, _, out in trace), default=0
    )
