"""``tensors_in``: the tensors inside a nested value, wherever one is needed (a module's output
that stage 3 hooks for backward, the output a custom model's loss is read off, a collective's
arguments that the communication counter measures)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Tensors in ``value``: itself, or inside tuples, lists and mappings (dicts, transformers'
    ``ModelOutput``s), depth first, in order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from tensors_in(item)
    elif isinstance(value, tuple | list):
        for item in value:
            yield from tensors_in(item)
