"""Rank 0's values of many tensors to every rank, one collective per device.

Each gloo collective is a round trip, and a model holds hundreds of small tensors (norms'
weights, biases, running statistics and int64 step counts), so they travel as their bytes in one
buffer per device rather than one broadcast per tensor or per dtype. A broadcast only copies
bits, so any dtype rides along; the widest elements go first, so each tensor then starts at a
multiple of its own element size, which viewing the bytes back as its dtype needs.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

from shardbench.strategies.sharded.release import release


@torch.no_grad()
def broadcast_coalesced(
    tensors: Iterable[torch.Tensor], *, src: int, group: dist.ProcessGroup | None
) -> None:
    """Overwrite every tensor of ``tensors`` (in place) with global rank ``src``'s values. A
    tensor listed twice (a tied weight) travels once."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    seen: set[int] = set()
    for t in tensors:
        if id(t) in seen or t.numel() == 0:
            continue
        seen.add(id(t))
        by_device.setdefault(t.device, []).append(t)
    receiving = dist.get_rank() != src
    for bufs in by_device.values():
        if len(bufs) == 1 and bufs[0].is_contiguous():
            dist.broadcast(bufs[0], src=src, group=group)
            continue
        bufs.sort(key=lambda b: -b.element_size())  # stable: registration order within a size
        flat = torch.cat([b.detach().reshape(-1).view(torch.uint8) for b in bufs])
        dist.broadcast(flat, src=src, group=group)
        if receiving:
            sizes = [b.numel() * b.element_size() for b in bufs]
            for b, value in zip(bufs, flat.split(sizes), strict=True):
                b.copy_(value.view(b.dtype).view_as(b))
        release(flat)  # here, not whenever the process group's thread lets go of it (release.py)
