"""DTensor's shape propagation, kept out of the memory a plan books.

Before a DTensor operator runs on its local shards, DTensor works out the output's global shape
by running the operator on fake tensors of the *global* shapes
(``ShardingPropagator._propagate_tensor_meta_non_cached``): metadata, never memory. On a real
rank those fake tensors live in a private FakeTensorMode and the result is cached per operator
and arguments. Under a fake plan, though, DTensor reuses the plan's own FakeTensorMode and skips
its cache (it takes fake mode for tracing), so every DTensor operator of every step allocates
global-shaped tensors in the plan's mode, and the memory tracker counted them as the rank's.

FSDP2's optimizer step is where this showed: its parameters are DTensors, and a ``foreach``
optimizer (CUDA's default) runs each update as one operator over every parameter, whose
propagation made global-shaped copies of all of them at once: a CUDA-targeted plan booked the
optimizer step at several times the whole model, with the peak moved there from backward.

``untracked()`` marks the time DTensor spends propagating shapes; the tracker leaves the tensors
made in it untracked (``running()``).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

_state = threading.local()
_lock = threading.Lock()
_installed = 0


def running() -> bool:
    """Whether DTensor is propagating shapes in this thread now."""
    return getattr(_state, "depth", 0) > 0


def _marked(propagate: Any) -> Any:
    @functools.wraps(propagate)
    def propagate_untracked(*args: Any, **kwargs: Any) -> Any:
        _state.depth = getattr(_state, "depth", 0) + 1
        try:
            return propagate(*args, **kwargs)
        finally:
            _state.depth -= 1

    propagate_untracked.__wrapped_propagation__ = propagate  # type: ignore[attr-defined]
    return propagate_untracked


@contextlib.contextmanager
def untracked() -> Iterator[None]:
    """Inside it, DTensor's shape propagation is marked (see ``running``); a torch without
    DTensor, or with its propagation elsewhere, has nothing to mark."""
    global _installed
    try:
        from torch.distributed.tensor._sharding_prop import ShardingPropagator
    except ImportError:
        yield
        return
    name = "_propagate_tensor_meta_non_cached"
    if not hasattr(ShardingPropagator, name):
        yield
        return
    with _lock:
        if _installed == 0:
            setattr(ShardingPropagator, name, _marked(getattr(ShardingPropagator, name)))
        _installed += 1
    try:
        yield
    finally:
        with _lock:
            _installed -= 1
            if _installed == 0:
                setattr(ShardingPropagator, name, getattr(ShardingPropagator, name).__wrapped_propagation__)
