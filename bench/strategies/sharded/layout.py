"""Flat buckets split evenly across ranks: the partition behind our ZeRO stages.

Trainable parameters are packed, in reverse registration order (roughly the order backward
produces their gradients), into flat buckets of at most ``cap`` elements (a parameter larger than
the cap gets a bucket of its own). Every bucket is padded to a multiple of the world size N and
split into N equal contiguous chunks; rank r owns chunk r of *every* bucket.

Why this layout, rather than whole parameters per rank (PyTorch's ZeroRedundancyOptimizer,
FairScale's OSS): it is balanced to the element. No rank ever owns more than
``ceil(bucket/N)`` elements of any bucket, so the largest rank holds total/N plus at most N-1
padding elements per bucket, whatever the parameter sizes (a 23M-element embedding included).
And each bucket maps onto one equal-chunk collective: ``reduce_scatter_tensor`` for gradients,
``all_gather_into_tensor`` for updated parameters.

A parameter may straddle a chunk boundary; the part of it a rank owns is a ``Piece``: a
contiguous range of the parameter's flattened elements, which is also a contiguous range of the
rank's chunk.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch import nn

# ----- bucket sizes and how many are reduced at once: every part reads them from here ---------
#: a bucket's cap, DDP's default: large enough that a collective's fixed cost is small
BUCKET_CAP_MB = 25.0
#: the first bucket's cap, DDP's (``_DEFAULT_FIRST_BUCKET_BYTES``): the gradients that come first
#: are reduced early, overlapping the rest of backward
FIRST_BUCKET_BYTES = 2**20
#: reductions in flight at once where buckets are sized by the cap: the next bucket fills while
#: one reduces, and the gradient memory held for reduction stays bounded
MAX_IN_FLIGHT = 2
#: stage 3's buckets are whole units (a transformer layer), not 25 MB, so one reduction in flight
#: overlaps the next unit's whole backward; it is completed before the next unit's gradients are
#: added into buffers of their own, so at most two units' full gradients exist at once
UNIT_IN_FLIGHT = 1

#: stage 3's parameters while their unit is freed are empty tensors (``gatherer.py``); their
#: whole shape is kept here, for what needs it between steps (state dicts), by id(parameter)
#: for as long as the parameter lives (a tensor cannot key a dict: its == is elementwise)
_WHOLE_SHAPES: dict[int, torch.Size] = {}


def whole_shape(p: torch.Tensor) -> torch.Size:
    """``p``'s shape as the model defines it, also while stage 3 keeps it empty."""
    return _WHOLE_SHAPES.get(id(p), p.shape)


def remember_whole_shape(p: torch.Tensor, shape: torch.Size) -> None:
    if id(p) not in _WHOLE_SHAPES:
        weakref.finalize(p, _WHOLE_SHAPES.pop, id(p), None)
    _WHOLE_SHAPES[id(p)] = shape


@dataclass(frozen=True)
class Piece:
    """The elements ``[lo, hi)`` of a parameter's flat view owned by this rank."""

    param_index: int  # index into Bucket.params
    lo: int  # within the parameter
    hi: int
    chunk_offset: int  # where they sit within this rank's chunk

    @property
    def numel(self) -> int:
        return self.hi - self.lo


@dataclass
class Bucket:
    """Parameters packed into one flat buffer of ``padded`` elements, N chunks of ``chunk``."""

    index: int
    params: list[nn.Parameter]
    offsets: list[int]  # start of each parameter within the flat buffer
    numel: int  # sum of parameter sizes
    padded: int  # numel rounded up to a multiple of the world size
    world_size: int
    rank: int
    pieces: list[Piece] = field(default_factory=list)

    @property
    def chunk(self) -> int:
        return self.padded // self.world_size

    @property
    def chunk_start(self) -> int:
        return self.rank * self.chunk


def owned_pieces(offsets: list[int], sizes: list[int], chunk_start: int, chunk_end: int) -> list[Piece]:
    """The parts of each parameter that fall in ``[chunk_start, chunk_end)`` of the flat buffer."""
    pieces = []
    for i, (off, size) in enumerate(zip(offsets, sizes, strict=True)):
        lo, hi = max(off, chunk_start), min(off + size, chunk_end)
        if lo < hi:
            pieces.append(Piece(i, lo - off, hi - off, lo - chunk_start))
    return pieces


def build_buckets(
    params: list[nn.Parameter],
    *,
    world_size: int,
    rank: int,
    cap_numel: int,
    first_index: int = 0,
    first_cap_numel: int | None = None,
) -> list[Bucket]:
    """Pack ``params`` (trainable, distinct) into buckets; one dtype and device per bucket.
    ``first_cap_numel`` caps the first bucket (the last layers, whose gradients come first)
    below the others, as DDP's 1 MiB first bucket does: its reduction then starts early in
    backward, overlapping the rest, also when the whole model would fit one bucket."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"bad rank {rank} for world size {world_size}")
    if cap_numel < 1:
        raise ValueError(f"bucket cap must be >= 1 element, got {cap_numel}")
    buckets: list[Bucket] = []
    current: list[nn.Parameter] = []
    current_numel = 0

    def close() -> None:
        nonlocal current_numel
        current_numel = 0
        if not current:
            return
        offsets, total = [], 0
        for p in current:
            offsets.append(total)
            total += p.numel()
        padded = -(-total // world_size) * world_size
        b = Bucket(first_index + len(buckets), list(current), offsets, total, padded, world_size, rank)
        b.pieces = owned_pieces(offsets, [p.numel() for p in current], b.chunk_start, b.chunk_start + b.chunk)
        buckets.append(b)
        current.clear()

    for p in reversed(params):
        same_kind = not current or (p.dtype == current[0].dtype and p.device == current[0].device)
        cap = min(first_cap_numel, cap_numel) if first_cap_numel is not None and not buckets else cap_numel
        if current and (not same_kind or current_numel + p.numel() > cap):
            close()
        current.append(p)
        current_numel += p.numel()
    close()
    return buckets


def flatten_into_buckets(buckets: list[Bucket]) -> list[torch.Tensor]:
    """Move each bucket's parameters into one flat buffer; parameters become views of it.

    Returns the flat buffers. Values are preserved; the old parameter storage is released.
    """
    flats = []
    for b in buckets:
        first = b.params[0]
        flat = torch.zeros(b.padded, dtype=first.dtype, device=first.device)
        with torch.no_grad():
            # the parameters' views in one split, not a slice each: under FakeTensorMode (a plan)
            # every slice at a new offset is an operator call its cache has not seen, about a
            # millisecond each, which a model of a thousand parameters pays a second for
            views = flat[: b.numel].split([p.numel() for p in b.params])
            for p, view in zip(b.params, views, strict=True):
                view.copy_(p.detach().reshape(-1))
                p.data = view.view_as(p)
        flats.append(flat)
    return flats
