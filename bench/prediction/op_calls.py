"""The operator calls of one training step, typed, for the op replay (``op_replay``): every aten
call the step's forward and backward dispatch (``OpCall``), its tensors described by shape,
strides, dtype and device (``TensorDesc``), counted by distinct call.

Recorded during the FLOP count (``flops.py``) by ``CallRecorder``, usually under fake tensors:
nothing is computed. Where the count runs on real tensors (a workload whose shapes depend on its
data), small integer and boolean tensors are recorded with their values (``VALUES_UP_TO``
elements): their values are what the call's work depends on (an LSTM's ``batch_sizes``, a CTC
loss's lengths, a mask), so the replay rebuilds them as they were. Under fake tensors no value
is known.

A rank hands its calls to the process that replays them, as JSON: ``calls_to_json`` and
``calls_from_json`` are the one codec, and the JSON is also what ``signature`` digests, so a
replay cached under one digest is found again.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
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
#: a step's calls as the codec writes them: plain JSON, one list per call (``call_to_json``)
CallsJson = list[list[Any]]
#: the kinds of argument that are no data, recorded by name (``Named``)
NAMED_KINDS = ("float", "dtype", "device", "layout", "memory_format", "opaque")


@dataclass(frozen=True)
class TensorDesc:
    """A tensor without its data: what replaying a call needs to make one like it. ``values``:
    a small integer or boolean tensor's, flattened, where they were known."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    device: str
    values: tuple[int | bool, ...] | None = None

    def reach(self) -> int:
        """The elements of storage this view's shape and strides reach."""
        return reach(self.shape, self.stride)

    def nbytes(self) -> int:
        return self.reach() * dtype_of(self.dtype).itemsize


@dataclass(frozen=True)
class Named:
    """An argument that is no data, by its kind (``NAMED_KINDS``) and name: a dtype, a device, a
    layout, a memory format, a non-finite float (``"-inf"``), or an object not recorded
    (``opaque``: replayed as None)."""

    kind: str
    name: str


@dataclass(frozen=True)
class OpCall:
    """One distinct call of a step: its operator (``aten.mm.default``), its arguments (lists,
    tuples and scalars as they were, tensors as ``TensorDesc``, the rest ``Named``), how many
    times the step makes it, and its output's bytes (what replaying it allocates besides its
    inputs)."""

    operator: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    count: int
    output_bytes: int

    def bytes_at_most(self) -> int:
        """The bytes of its inputs and output: what replaying it allocates at least."""
        return tensor_bytes(self.args) + tensor_bytes(self.kwargs) + self.output_bytes


def reach(shape: Sequence[int], stride: Sequence[int]) -> int:
    """The elements of storage a view of ``shape`` and ``stride`` reaches."""
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) if all(shape) else 0


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def _is_fake(x: torch.Tensor) -> bool:
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:
        return False
    return isinstance(x, FakeTensor)


def _describe_tensor(x: torch.Tensor) -> TensorDesc:
    """A tensor by its shape, strides, dtype and device, and its values where they are known
    and the call's work may follow them (see the module docstring)."""
    values = None
    exact = not (x.dtype.is_floating_point or x.dtype.is_complex)
    if exact and x.numel() <= VALUES_UP_TO and x.device.type != "meta" and not _is_fake(x):
        values = tuple(x.detach().cpu().reshape(-1).tolist()) if x.numel() else ()
    dtype = str(x.dtype).removeprefix("torch.")
    return TensorDesc(tuple(x.shape), tuple(x.stride()), dtype, x.device.type, values)


def describe(x: Any) -> Any:
    """An argument as a call records it: tensors as ``TensorDesc``, lists and tuples of
    described arguments, finite scalars as themselves, anything else ``Named``."""
    if isinstance(x, torch.Tensor):
        return _describe_tensor(x)
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else Named("float", repr(x))
    if isinstance(x, (list, tuple)):
        return type(x)(describe(v) for v in x)
    if isinstance(x, torch.dtype):
        return Named("dtype", str(x).removeprefix("torch."))
    if isinstance(x, torch.device):
        return Named("device", x.type)
    if isinstance(x, (torch.layout, torch.memory_format)):
        kind = "layout" if isinstance(x, torch.layout) else "memory_format"
        return Named(kind, str(x).removeprefix("torch."))
    return Named("opaque", type(x).__name__)  # not data (a generator)


def tensor_bytes(x: Any) -> int:
    """The bytes of the tensors in ``x``: described ones (the storage their strides reach), or a
    call's real or fake output."""
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, TensorDesc):
        return x.nbytes()
    values = x.values() if isinstance(x, dict) else x if isinstance(x, (list, tuple)) else ()
    return sum(tensor_bytes(v) for v in values)


def arg_to_json(x: Any) -> Any:
    """A described argument as JSON: a tensor ``{"t": [shape, stride, dtype, device]}`` (and its
    ``values``), lists and tuples kept apart, a ``Named`` as ``{kind: name}``."""
    if isinstance(x, TensorDesc):
        out: dict[str, Any] = {"t": [list(x.shape), list(x.stride), x.dtype, x.device]}
        if x.values is not None:
            out["values"] = list(x.values)
        return out
    if isinstance(x, Named):
        return {x.kind: x.name}
    if isinstance(x, (list, tuple)):
        return {"list" if isinstance(x, list) else "tuple": [arg_to_json(v) for v in x]}
    return x


def arg_from_json(x: Any) -> Any:
    """``arg_to_json``'s inverse."""
    if not isinstance(x, dict):
        return x
    if "t" in x:
        shape, stride, dtype, device = x["t"]
        values = tuple(x["values"]) if "values" in x else None
        return TensorDesc(tuple(shape), tuple(stride), dtype, device, values)
    if "list" in x:
        return [arg_from_json(v) for v in x["list"]]
    if "tuple" in x:
        return tuple(arg_from_json(v) for v in x["tuple"])
    ((kind, name),) = x.items()
    if kind not in NAMED_KINDS:
        raise ValueError(f"not an encoded argument: {x!r}")
    return Named(kind, name)


def call_to_json(call: OpCall) -> list[Any]:
    """``[operator, args, kwargs, count, output bytes]``, the arguments as ``arg_to_json``."""
    kwargs = {k: arg_to_json(v) for k, v in call.kwargs.items()}
    return [call.operator, arg_to_json(list(call.args)), kwargs, call.count, call.output_bytes]


def call_from_json(data: Sequence[Any]) -> OpCall:
    operator, args, kwargs, count, output_bytes = data
    return OpCall(
        operator,
        tuple(arg_from_json(args)),
        {k: arg_from_json(v) for k, v in kwargs.items()},
        int(count),
        int(output_bytes),
    )


def calls_to_json(calls: Sequence[OpCall]) -> CallsJson:
    return [call_to_json(c) for c in calls]


def calls_from_json(data: CallsJson) -> tuple[OpCall, ...]:
    return tuple(call_from_json(c) for c in data)


def signature(calls: Sequence[OpCall]) -> str:
    """A digest of a step's calls and counts: two steps with the same digest replay alike."""
    return hashlib.sha256(json.dumps(calls_to_json(calls), sort_keys=True).encode()).hexdigest()[:16]


def largest_call_bytes(calls: Sequence[OpCall]) -> int:
    """The most bytes one call's tensors take, its inputs and its output: what replaying it
    allocates at least."""
    return max((c.bytes_at_most() for c in calls), default=0)


class CallRecorder(TorchDispatchMode):
    """Counts each distinct operator call of the pass it is active over, by its operator and its
    described arguments, and keeps each call's output bytes."""

    def __init__(self) -> None:
        super().__init__()
        self._counts: Counter[str] = Counter()
        self._calls: dict[str, OpCall] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        try:
            call = OpCall(str(func), describe(tuple(args)), {k: describe(v) for k, v in kwargs.items()}, 0, 0)
        except Exception:  # noqa: BLE001 - a layout without strides: kept, and replayed as unreplayable
            call = OpCall(str(func), (Named("opaque", "unrecorded"),), {}, 0, 0)
        key = json.dumps(call_to_json(call))
        out = func(*args, **kwargs)
        self._counts[key] += 1
        if key not in self._calls:
            try:
                output = tensor_bytes(out)
            except Exception:  # noqa: BLE001 - an output without storage counts as none
                output = 0
            self._calls[key] = OpCall(call.operator, call.args, call.kwargs, 0, output)
        return out

    def calls(self) -> tuple[OpCall, ...]:
        """Every distinct call with its count, in a fixed order."""
        return tuple(
            OpCall(c.operator, c.args, c.kwargs, self._counts[k], c.output_bytes)
            for k, c in sorted(self._calls.items())
        )
