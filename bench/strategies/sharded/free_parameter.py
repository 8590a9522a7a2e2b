"""Stage 3's parameters refuse every read of their values while their unit is freed.

Between uses a stage-3 parameter holds no values here: its unit's buffers keep only this rank's
chunk (``gatherer.py``), and the parameter points at an empty tensor. Read as it is, it would
answer silently wrong: a sum of no elements is 0, a norm is 0, a copy is empty. So a plain
``nn.Parameter`` is given this subclass for as long as the wrapper shards it: while its unit is
freed, any torch function or tensor method that would read its values (``sum``, ``norm``,
``clone``, ``.data``, indexing, ``torch.save``, printing, a copy to another device or dtype)
raises one line naming the ways to the values; a conversion that changes nothing (``.cpu()`` of
a parameter already there) returns the parameter itself, still refusing; what describes the
tensor rather than its values (shape, dtype, device, ``requires_grad``, its gradient, hashing,
storage identity) still answers, and setting ``.data``, ``.grad`` or ``requires_grad`` works.
While its unit is gathered every call passes straight through. Results are plain tensors, as a
plain ``nn.Parameter``'s are.

``torch.equal`` also answers while freed, comparing the empty tensors (equal only for the same
parameter): a fine-tuning callback compares parameters that way to tell which ones an optimizer
already has, and that question is about identity, not values.

Parameters that are already some other tensor subclass (fake tensors while planning) keep their
class and the empty tensor between uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

SHARDED = (
    "the parameters of a module wrapped in ShardedDataParallel(stage=3) are sharded between uses; "
    "read them with wrapper.full_state_dict() or inside `with wrapper.summon_full_params():` "
    "(each a collective: call it on every rank)"
)

_T = torch.Tensor
#: what answers while the values are sharded: descriptions of the tensor, never its values
_DESCRIBE: set[Callable[..., Any]] = {
    torch.equal,
    torch._has_compatible_shallow_copy_type,  # nn.Module._apply asks it (module.cpu())
    _T.__hash__,
    _T.dim,
    _T.element_size,
    _T.is_contiguous,
    _T.is_floating_point,
    _T.is_complex,
    _T.nelement,
    _T.numel,
    _T.size,
    _T.stride,
    _T.storage_offset,
    _T.untyped_storage,
    _T.data_ptr,
    _T.get_device,
    _T.requires_grad_,
    _T.register_hook,
    _T.register_post_accumulate_grad_hook,
    _T.__len__,
}
for _name in (
    "shape", "dtype", "device", "requires_grad", "is_leaf", "grad", "grad_fn", "layout", "ndim",
    "is_cuda", "is_cpu", "is_meta", "is_sparse", "is_quantized", "is_nested", "retains_grad",
    "_base", "_version", "names", "itemsize",
):  # fmt: skip
    _descriptor = getattr(_T, _name, None)
    if _descriptor is not None and hasattr(_descriptor, "__get__"):
        _DESCRIBE.add(_descriptor.__get__)
for _name in ("data", "grad", "requires_grad"):
    _DESCRIBE.add(getattr(_T, _name).__set__)


#: conversions that return the tensor itself where nothing changes (``module.cpu()`` on a model
#: already there, as Lightning's teardown calls): allowed then, since no value is read; refused
#: where they would copy the values
_SAME_OR_REFUSE: set[Callable[..., Any]] = {
    _T.cpu, _T.cuda, _T.to, _T.float, _T.half, _T.bfloat16, _T.double, _T.contiguous, _T.type_as,
}  # fmt: skip


def _name_of(func: Callable[..., Any]) -> str:
    name = getattr(func, "__name__", None) or repr(func)
    owner = getattr(func, "__objclass__", None)
    if owner is not None and name == "__get__":  # a property read (.data)
        return f".{getattr(owner, '__name__', '')}"
    return f"{name}()" if not name.startswith("__") else name


def _freed(value: Any) -> bool:
    return type(value) is FreeableParameter and value.__dict__.get("_shardbench_freed", False)


class FreeableParameter(nn.Parameter):
    """``nn.Parameter`` whose values may be sharded away (see the module docstring)."""

    @classmethod
    def __torch_function__(
        cls, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        refuse = func not in _DESCRIBE and _reads_freed(args, kwargs)
        if refuse and func not in _SAME_OR_REFUSE:
            raise RuntimeError(f"{_name_of(func)} of a stage-3 parameter: {SHARDED}")
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if refuse and out is not args[0]:
            raise RuntimeError(f"{_name_of(func)} of a stage-3 parameter: {SHARDED}")
        return out


def _reads_freed(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    for value in (*args, *kwargs.values()):
        if _freed(value):
            return True
        if isinstance(value, list | tuple) and any(_freed(v) for v in value):
            return True
    return False


def make_freeable(p: nn.Parameter) -> None:
    """Give ``p`` the class that refuses reads while freed (a plain ``nn.Parameter`` only)."""
    if type(p) is nn.Parameter:
        p.__class__ = FreeableParameter


def set_freed(p: nn.Parameter, freed: bool) -> None:
    if type(p) is FreeableParameter:
        p.__dict__["_shardbench_freed"] = freed


def make_plain(p: nn.Parameter) -> None:
    """``p`` back to a plain ``nn.Parameter`` (the wrapper closed, or a copy of the module)."""
    if type(p) is FreeableParameter:
        p.__dict__.pop("_shardbench_freed", None)
        p.__class__ = nn.Parameter
