"""``FrozenShards``: stage 3's parameters that take no gradient, sharded as the trainable ones are.

A frozen parameter (``requires_grad=False``: an embedding or a backbone kept fixed while
fine-tuning) has no gradient to reduce and no optimizer state, so the optimizer never sees it;
but it is as large as a trainable one, and kept whole on every rank it would cost stage 3 its
saving on exactly the models that freeze most. So each unit's frozen parameters (``units.py``:
the same lowest-common-ancestor rule as the trainable ones) are packed into flat buffers
(``layout.py``: one per dtype and device, padded to N equal chunks), each rank keeps its own
chunk as a tensor of its own, and the buffers' storage is freed; the ``UnitGatherer`` gathers
and frees them together with the unit's trainable buffers. Nothing else touches them: no
gradient hook, no reduction, no step.

Ranks start from rank 0's values, broadcast before the chunks are cut (as the trainable
parameters are, ``ShardedDataParallel._start_identical``): the chunks of different ranks then
gather into one model's weights even where the ranks initialised theirs differently.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from shardbench.strategies.sharded.layout import Bucket, build_buckets, flatten_into_buckets
from shardbench.strategies.sharded.units import Unit


class FrozenShards:
    """The frozen parameters of ``units``, this rank's chunk of each unit's flat buffers kept
    (see the module docstring); ``src`` is the global rank whose values every rank starts from."""

    def __init__(
        self,
        units: list[Unit],
        *,
        world_size: int,
        rank: int,
        process_group: dist.ProcessGroup | None,
        src: int,
    ) -> None:
        self.buckets: list[Bucket] = []
        self.flats: list[torch.Tensor] = []  # the frozen parameters are views of these
        self.chunks: list[torch.Tensor] = []  # this rank's chunk of each, a tensor of its own
        #: each unit's buckets (indices into the lists above)
        self.unit_buckets: list[list[int]] = [[] for _ in units]
        for u in units:
            if not u.frozen:
                continue
            buckets = build_buckets(
                u.frozen,
                world_size=world_size,
                rank=rank,
                cap_numel=sum(p.numel() for p in u.frozen),  # one bucket per dtype and device
                first_index=len(self.buckets),
            )
            for b in buckets:
                # one bucket at a time: the model is never held twice over
                (flat,) = flatten_into_buckets([b])
                if world_size > 1:
                    dist.broadcast(flat, src=src, group=process_group)
                chunk = flat[b.chunk_start : b.chunk_start + b.chunk].clone()
                flat.untyped_storage().resize_(0)
                self.unit_buckets[u.index].append(len(self.buckets))
                self.buckets.append(b)
                self.flats.append(flat)
                self.chunks.append(chunk)

    def buffers(self, u: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Unit ``u``'s (flat buffer, this rank's chunk) pairs."""
        return [(self.flats[i], self.chunks[i]) for i in self.unit_buckets[u]]
