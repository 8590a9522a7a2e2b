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

A frozen value never changes, so while a unit is gathered its chunk is only a copy of part of
the whole buffer: it is released once the gather completes and cut again from the buffer just
before the buffer is freed. A unit kept whole for long (the root, from its forward to the end of
its backward) then costs its full frozen parameters and nothing more, as if they were never
sharded, and between uses 1/N of them.

Ranks start from rank 0's values, which ``ShardedDataParallel._start_identical`` broadcasts
before the chunks are cut: the chunks of different ranks then gather into one model's weights
even where the ranks initialised theirs differently.
"""

from __future__ import annotations

import torch

from shardbench.strategies.sharded.layout import Bucket, build_buckets, flatten_into_buckets
from shardbench.strategies.sharded.units import Unit


class FrozenShards:
    """The frozen parameters of ``units``, this rank's chunk of each unit's flat buffers kept
    (see the module docstring)."""

    def __init__(self, units: list[Unit], *, world_size: int, rank: int) -> None:
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
                chunk = flat[b.chunk_start : b.chunk_start + b.chunk].clone()
                flat.untyped_storage().resize_(0)
                self.unit_buckets[u.index].append(len(self.buckets))
                self.buckets.append(b)
                self.flats.append(flat)
                self.chunks.append(chunk)

    def buffers(self, u: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Unit ``u``'s (flat buffer, this rank's chunk) pairs."""
        return [(self.flats[i], self.chunks[i]) for i in self.unit_buckets[u]]

    def release_chunks(self, u: int) -> None:
        """Unit ``u``'s buffers are whole (its gathers completed): its chunks' storage goes."""
        for i in self.unit_buckets[u]:
            if self.flats[i].untyped_storage().size():
                self.chunks[i].untyped_storage().resize_(0)

    @torch.no_grad()
    def restore_chunks(self, u: int) -> None:
        """Unit ``u``'s buffers are about to be freed: cut its released chunks from them again."""
        for i in self.unit_buckets[u]:
            b, flat, chunk = self.buckets[i], self.flats[i], self.chunks[i]
            if chunk.untyped_storage().size() == 0 and flat.untyped_storage().size():
                chunk.untyped_storage().resize_(chunk.numel() * chunk.element_size())
                chunk.copy_(flat[b.chunk_start : b.chunk_start + b.chunk])
