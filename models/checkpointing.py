"""Activation checkpointing (``--activation-checkpointing``): each unit a workload names keeps
only its inputs from the forward pass and recomputes the rest in backward.

The one idea: a unit *stays the module it was*. Its class is swapped for a subclass whose
``forward`` runs the original one under ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``,
so no wrapper module appears: parameter and state-dict names are unchanged, and FSDP2's per-block
``fully_shard`` and our sharded strategies find the same modules under the same names. It is
applied right after the model is built, before a strategy wraps it (as torchtitan applies AC
before ``fully_shard``), so FSDP2's pre-forward and pre-backward hooks run around the
checkpointed forward and the recompute sees gathered parameters. A subclass rather than a
per-instance ``forward`` attribute because ``nn.DataParallel`` replicates a module by copying
its ``__dict__``: a bound forward stored there would run the original replica's parameters on
every device.

Three things a recompute must not change:

* RNG: ``preserve_rng_state=True`` restores the CPU and device RNG of the original forward, so
  dropout draws the same masks and gradients equal the plain model's.
* Normalisation buffers: a training-mode BatchNorm updates ``running_mean``, ``running_var`` and
  ``num_batches_tracked`` on every forward, so recomputing it would count the batch twice. The
  recompute runs under a context (``checkpoint``'s ``context_fn``) that snapshots the unit's
  norm buffers when the recompute starts (they are then as the whole forward left them) and
  restores them when it ends, early stop included.
* Torch function modes: the recompute runs under the ``TorchFunctionMode`` stack the forward
  ran under. Backward is itself a torch function (``Tensor.backward``, ``torch.autograd.grad``),
  and torch takes each mode off its stack while the mode handles a call, so the autograd engine,
  and the recompute inside it, would otherwise run with no mode at all. A mode that changes
  which kernel runs (a CUDA plan's attention, ``bench/metrics/kernels.py``) would then pick
  another kernel for the recompute than for the forward, which saves other tensors, and
  checkpointing refuses the step.

``recomputing()`` says whether a recompute is running: a FLOP count of a checkpointed step
books what runs then as the recompute (hardware FLOPs only), so the rest is the math the step
does once (model FLOPs), from one pass.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase
from torch.utils.checkpoint import checkpoint

try:  # private: present in the torch both machines run; without it a recompute runs as torch does
    from torch.overrides import _get_current_function_mode_stack, _pop_mode, _push_mode
except ImportError:  # pragma: no cover
    _get_current_function_mode_stack = None  # type: ignore[assignment]

#: the recomputes running now, per thread: a recompute and the operator calls it makes run on one
#: thread (on CUDA the autograd engine's, which runs backward), and another thread's are not its
_recomputes = threading.local()

#: original class -> its checkpointed subclass (one per class, so isinstance and FSDP2's
#: per-class wrapper cache keep working)
_CHECKPOINTED: dict[type, type] = {}


class RestoreNormBuffers:
    """Context: the running statistics of every norm layer in ``unit`` are, on exit, what they
    were on entry (values copied back in place: the same tensors, so a strategy or optimizer
    holding them sees the restored values)."""

    def __init__(self, unit: nn.Module) -> None:
        self.buffers = [
            b for m in unit.modules() if isinstance(m, _NormBase) for b in m.buffers(recurse=False)
        ]
        self.saved: list[torch.Tensor] = []

    def __enter__(self) -> RestoreNormBuffers:
        self.saved = [b.detach().clone() for b in self.buffers]
        return self

    def __exit__(self, *exc: object) -> None:
        with torch.no_grad():
            for buffer, saved in zip(self.buffers, self.saved, strict=True):
                buffer.copy_(saved)
        self.saved = []


class ForwardFunctionModes:
    """Context: the torch function modes on the stack when it was made (the forward's) that
    are off it on entry (backward took them off: see the module docstring) are pushed back
    until exit, above whatever is on the stack then."""

    def __init__(self) -> None:
        self.modes = _get_current_function_mode_stack() if _get_current_function_mode_stack else []
        self.pushed = 0

    def __enter__(self) -> ForwardFunctionModes:
        on_stack = {id(mode) for mode in _get_current_function_mode_stack()}
        for mode in self.modes:
            if id(mode) not in on_stack:  # pushed as torch pops them, so no mode's __enter__ runs twice
                _push_mode(mode)
                self.pushed += 1
        return self

    def __exit__(self, *exc: object) -> None:
        for _ in range(self.pushed):
            _pop_mode()
        self.pushed = 0


@contextlib.contextmanager
def _recompute_context(unit: nn.Module, modes: ForwardFunctionModes) -> Iterator[None]:
    with modes, RestoreNormBuffers(unit):
        _recomputes.running = getattr(_recomputes, "running", 0) + 1
        try:
            yield
        finally:
            _recomputes.running -= 1


def recomputing() -> bool:
    """Whether a checkpointed unit is recomputing its forward now, on this thread (see the
    module docstring)."""
    return getattr(_recomputes, "running", 0) > 0


def _contexts(unit: nn.Module) -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """``checkpoint``'s ``context_fn``, called as the forward starts: nothing around the
    forward; around the recompute, the forward's torch function modes and the norm buffers
    kept."""
    return contextlib.nullcontext(), _recompute_context(unit, ForwardFunctionModes())


def _checkpointed_class(cls: type[nn.Module]) -> type[nn.Module]:
    if cls not in _CHECKPOINTED:
        original: Callable[..., Any] = cls.forward

        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():  # nothing to recompute
                return original(self, *args, **kwargs)
            return checkpoint(
                original,
                self,
                *args,
                use_reentrant=False,
                preserve_rng_state=True,
                context_fn=functools.partial(_contexts, self),
                **kwargs,
            )

        forward.__doc__ = f"{cls.__qualname__}.forward under activation checkpointing."
        _CHECKPOINTED[cls] = type(
            f"Checkpointed{cls.__name__}", (cls,), {"forward": forward, "__module__": cls.__module__}
        )
    return _CHECKPOINTED[cls]


def is_checkpointed(module: nn.Module) -> bool:
    return type(module) in _CHECKPOINTED.values()


def apply_activation_checkpointing(model: nn.Module, units: Sequence[nn.Module]) -> None:
    """Checkpoint each of ``units`` (submodules of ``model``) in place; see the module docstring.

    Raises ``ValueError`` for an empty list, a module that is not in ``model``, a unit inside
    another unit (its activations are already recomputed by the outer one) or one already
    checkpointed."""
    if not units:
        raise ValueError("activation checkpointing got no units to checkpoint")
    in_model = {id(m): name for name, m in model.named_modules()}
    chosen = {id(u) for u in units}
    for unit in units:
        name = in_model.get(id(unit))
        if name is None:
            raise ValueError(f"checkpoint unit {type(unit).__name__} is not a submodule of the model")
        if is_checkpointed(unit):
            raise ValueError(f"checkpoint unit {name or '<root>'!r} is already checkpointed")
        inner = [n for n, m in unit.named_modules() if m is not unit and id(m) in chosen]
        if inner:
            raise ValueError(
                f"checkpoint unit {name or '<root>'!r} contains another unit ({inner[0]!r}); "
                "units must not nest"
            )
    for unit in units:
        unit.__class__ = _checkpointed_class(type(unit))
