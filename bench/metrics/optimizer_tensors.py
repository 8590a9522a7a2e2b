"""How many tensors a rank's optimizer steps over: the update's per-tensor cost follows them
(``prediction/update_probe.py``). PyTorch's loop implementation of AdamW runs a dozen small
kernels per tensor, so a model of a hundred small tensors pays for them as much as for its
elements; a sharded optimizer steps over its own pieces, which may be fewer or more.

A wrapper that shards the optimizer state keeps the optimizer that really steps inside it: ours
as ``local``, FairScale's OSS and torch's ZeroRedundancyOptimizer as ``optim``, DeepSpeed's ZeRO as
``optimizer``. The count is that innermost optimizer's trainable tensors: each DTensor (FSDP2's
shards), as the loop steps each, even one holding no elements on this rank; a plain tensor where it
holds elements (our ZeRO's pieces: an empty one is not handed to the optimizer).

Its per-element cost follows each tensor's size, not only their sum (AdamW's loop allocates
temporaries the size of the tensor it steps, and a large one is mapped afresh each time:
``prediction/update_probe.py``), so ``stepped_elements`` lists them. Where those tensors are
DTensors, each op of the update is dispatched through DTensor's sharding
propagation, whose cost follows the tensors' shapes in the order they are stepped
(``prediction/dtensor_update_probe.py``): ``stepped_dtensor_shapes`` lists them."""

from __future__ import annotations

from typing import Any

import torch

#: where a wrapping optimizer keeps the one that steps, tried in turn
INNER = ("local", "optim", "optimizer")


def stepping_optimizer(optimizer: Any) -> Any:
    """The innermost optimizer of ``optimizer``'s wrappers (``INNER``)."""
    for _ in range(len(INNER) + 1):
        inner = [getattr(optimizer, name, None) for name in INNER]
        found = next((v for v in inner if isinstance(v, torch.optim.Optimizer) and v is not optimizer), None)
        if found is None:
            break
        optimizer = found
    return optimizer


def stepped(optimizer: Any) -> list[torch.Tensor] | None:
    """The tensors ``optimizer`` steps over on this rank, in the order it steps them (see the
    module docstring); None where it has no parameter groups to read."""
    groups = getattr(stepping_optimizer(optimizer), "param_groups", None)
    if groups is None:
        return None
    return [
        p
        for group in groups
        for p in group["params"]
        if p.requires_grad and (hasattr(p, "_local_tensor") or p.numel() > 0)
    ]


def stepped_tensors(optimizer: Any) -> int | None:
    """How many tensors ``optimizer`` steps over on this rank; None where it cannot be read."""
    tensors = stepped(optimizer)
    return None if tensors is None else len(tensors)


def stepped_elements(optimizer: Any) -> list[int] | None:
    """The elements of each tensor ``optimizer`` steps over on this rank, in its order (a
    DTensor's local shard's); None where it steps over none or cannot be read."""
    tensors = stepped(optimizer)
    return [_local(p).numel() for p in tensors] if tensors else None


def stepped_dtensor_shapes(optimizer: Any) -> list[list[int]] | None:
    """The global shapes of the DTensors ``optimizer`` steps over on this rank, in the order it
    steps them; None where it steps over none (or has no parameter groups to read)."""
    shapes = [list(p.shape) for p in stepped(optimizer) or [] if hasattr(p, "_local_tensor")]
    return shapes or None


def _local(p: torch.Tensor) -> torch.Tensor:
    return p._local_tensor if hasattr(p, "_local_tensor") else p
