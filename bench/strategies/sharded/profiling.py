"""Profiler labels that cost nothing when no profiler records.

Our collectives and steps carry labels (``shardbench::<stage>::reduce``, ``::gather``, ``::step``)
that ``--trace`` reads. Entering a ``record_function`` costs microseconds even with no profiler
running, and a step enters one per bucket and per unit: hundreds with many small tensors."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.profiler import record_function


def profiled(name: str) -> contextlib.AbstractContextManager[Any]:
    """``record_function(name)`` while a profiler records, else nothing."""
    enabled = getattr(torch._C._autograd, "_profiler_enabled", None)
    return record_function(name) if enabled is None or enabled() else contextlib.nullcontext()
