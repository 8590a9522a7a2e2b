"""``tensors_in``: the tensors inside a nested value, wherever one is needed (a module's output
that stage 3 hooks for backward, the output a custom model's loss is read off, a collective's
arguments that the communication counter measures)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
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


def replace_tensors(
    value: Any, replacements: Iterator[torch.Tensor], wanted: Callable[[torch.Tensor], bool]
) -> Any:
    """``value`` with each tensor that is ``wanted`` replaced by the next of ``replacements``,
    in ``tensors_in``'s order, inside tuples, lists and plain dicts (other containers are kept
    as they are, their tensors untouched)."""
    if isinstance(value, torch.Tensor):
        return next(replacements) if wanted(value) else value
    if type(value) is dict:
        return {k: replace_tensors(v, replacements, wanted) for k, v in value.items()}
    if type(value) in (tuple, list):
        return type(value)(replace_tensors(v, replacements, wanted) for v in value)
    return value


def plain_tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """The tensors ``replace_tensors`` can replace: those of ``tensors_in`` outside containers
    other than tuples, lists and plain dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif type(value) is dict:
        for item in value.values():
            yield from plain_tensors_in(item)
    elif type(value) in (tuple, list):
        for item in value:
            yield from plain_tensors_in(item)
