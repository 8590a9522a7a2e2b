"""Callbacks that reach their object through a weak reference.

The optimizer, the parameters' gradient hooks and the modules' forward hooks keep callbacks into
the wrapper's parts. Bound methods there would be reference cycles (through hook dicts, which the
garbage collector cannot traverse), keeping the wrapper, the model and any process group it holds
alive for good; a process group that outlives ``destroy_process_group`` aborts the interpreter at
exit (see ``groups.py``)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any


def weakly(method: Callable[..., Any], *first: Any, required: str = "") -> Callable[..., Any]:
    """``method`` (with ``first`` as its leading arguments), called through a weak reference to
    its object. Once the object is gone the callback does nothing, or raises ``required`` when
    that is given."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> Any:
        bound = ref()
        if bound is not None:
            return bound(*first, *args)
        if required:
            raise RuntimeError(required)
        return None

    return call
