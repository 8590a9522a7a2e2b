"""``GradientReducer``: each bucket's gradients averaged across ranks, each rank keeping the
reduced values of the chunk it owns (``layout.py``), which is all its optimizer reads.

It keeps them one of two ways:

- ``keep="shards"`` (stages 2 and 3): a bucket's flat buffer lives only from its first gradient
  until its reduction completes; the rank keeps its reduced chunk as a gradient shard (1/N of
  the gradients). The forward pass, where activations peak, then holds no gradient memory.
- ``keep="full"`` (stage 1): the bucket buffers are kept for the whole of training, as DDP keeps
  its gradient buckets: full gradients exist on every rank, which is what stage 1 does not save.
  A rank's own chunk of each buffer holds the reduced sum; the rest is zeroed after each
  reduction, ready for the next backward.

Summing across ranks averages because each rank's contribution is scaled by 1/N first, as DDP
pre-divides: a bucket buffer of stages 2 and 3 is filled by plain copies into an uninitialised
buffer (regions no gradient reached, and the padding, are zeroed at launch) and scaled once at
launch; stage 1 adds each gradient scaled into its persistent buffer, so backward passes without
``zero_grad`` in between accumulate (the owned chunk already holds the earlier passes' average,
and only this rank contributes it).

The collective is ``reduce_scatter`` (each rank receives its own chunk: 2 (N-1)/N x the bucket
sent per rank with the parameters' all-gather, DDP's volume), ``all_reduce`` in place (every
rank receives every chunk and keeps its own), or ``reduce``: one reduce per chunk, to the rank
that owns it (the reduce-scatter's volume, as N collectives). gloo's reduce-scatter is slower
than either; see ``default_collective`` for which gloo uses.

At most ``max_in_flight`` reductions run at once; launching one more first waits for the oldest.
That bound, not the number of buckets, is what limits the memory in communication buffers.
Under hybrid sharding a bucket's reduction has two collectives: within its shard group, then,
once that completes, an all-reduce of the rank's chunk across the replicas. The second is
started at the first's completion and runs while backward goes on; each kind is bounded alike.

Memory is the same bytes whatever the timing of the collectives, so that a peak measured twice
is the same peak: a reduction completes only at fixed points (a launch past the bound, ``drain``),
never because it happened to have finished, and what it leaves behind (the bucket buffer, a
reduce-scatter's output added into the shard, the used-gradient flags) is freed there, by
emptying its storage (``release.py``) rather than by dropping our references to it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from shardbench.metrics.analytic import sharded_gradient_collective
from shardbench.strategies.sharded.fake import is_fake
from shardbench.strategies.sharded.groups import held_weakly
from shardbench.strategies.sharded.layout import MAX_IN_FLIGHT, Bucket, whole_shape
from shardbench.strategies.sharded.profiling import profiled
from shardbench.strategies.sharded.release import release

KEEPS = ("shards", "full")
COLLECTIVES = ("all_reduce", "reduce_scatter", "reduce")


def default_collective(backend: str, world_size: int) -> str:
    """How gradients are reduced on ``backend`` at ``world_size`` ranks: the rule the
    communication prediction counts as well (``analytic.sharded_gradient_collective``), so
    what runs and what is predicted cannot part."""
    return sharded_gradient_collective(backend, world_size)


class _Each:
    """The asynchronous works of a collective issued as several (``reduce``: one per chunk),
    with the surface of one."""

    def __init__(self, works: Sequence[Any]) -> None:
        self.works = list(works)

    def wait(self) -> None:
        for w in self.works:
            w.wait()

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)


def _views_like(flat: torch.Tensor, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Views of ``flat``, one per parameter in order, each shaped like it: one call into torch's
    C++ (``unflatten_dense_tensors``) rather than one ``view`` per parameter from Python, which
    took as long as copying the gradients in, with a thousand small tensors. (Stage 3's
    parameters of a freed unit are empty: their whole shapes come from the layout.)"""
    shapes = [whole_shape(p) for p in params]
    unflatten = getattr(getattr(torch._C, "_nn", None), "unflatten_dense_tensors", None)
    if unflatten is not None and all(p.shape == s for p, s in zip(params, shapes, strict=True)):
        return list(unflatten(flat, list(params)))
    views = flat.split([s.numel() for s in shapes])
    return [v.view(s) for v, s in zip(views, shapes, strict=True)]


@dataclass
class Agreement:
    """A used-gradient all-reduce in flight (``GradientReducer.start_agreeing``)."""

    work: Any
    flags: torch.Tensor
    local: list[int]  # this rank's flags: the answer where values do not exist (fake tensors)
    slots: int  # how many of the flags are parameters' (the rest are the caller's extras)
    #: the flags ride in a bucket's buffer (``folds_flags``): they are read when that bucket's
    #: reduction completes, and freed with its buffer
    in_bucket: bool = False
    values: list[int] | None = None  # the agreed flags, once read

    def read(self) -> list[int]:
        """Wait for the all-reduce; the agreed flags. Planning under FakeTensorMode the values do
        not exist, and no other rank of the fake world contributes, so this rank's own flags are
        the answer."""
        if self.values is None:
            if self.work is not None:
                self.work.wait()
            self.values = self.local if is_fake(self.flags) else self.flags.tolist()
        return self.values


class GradientReducer:
    """Reduces ``buckets``' gradients to their owners; see the module docstring.

    It is the optimizer's gradient source (``ShardedOptimizer.attach``): ``gradient_chunk`` and
    ``received_gradient`` tell the optimizer what to step, ``on_zero_grad`` is told when its
    gradients are cleared."""

    def __init__(
        self,
        buckets: Sequence[Bucket],
        *,
        world_size: int,
        process_group: dist.ProcessGroup | None,
        keep: str,
        collective: str,
        max_in_flight: int = MAX_IN_FLIGHT,
        label: str = "zero2",
        fold_flags: bool = False,
        replicas: int = 1,
        replicate_group: Callable[[], dist.ProcessGroup | None] | None = None,
        agree_group: Callable[[], dist.ProcessGroup | None] | None = None,
    ) -> None:
        if keep not in KEEPS:
            raise ValueError(f"keep must be one of {', '.join(KEEPS)}, got {keep!r}")
        if collective not in COLLECTIVES:
            raise ValueError(f"collective must be one of {', '.join(COLLECTIVES)}, got {collective!r}")
        self.buckets = list(buckets)
        self.world_size = world_size
        self.keep = keep
        self.collective = collective
        self.max_in_flight = max(1, max_in_flight)
        #: names the profiler labels (``shardbench::<label>::reduce``) and the optimizer's
        self.label = label
        #: memory accounting observer: called with each tensor allocated here and its category
        #: ("grads" for what a rank keeps as gradients, "comm" for buffers in flight)
        self.memory_observer: Callable[[torch.Tensor, str], None] | None = None
        self._init_groups(process_group, replicas, replicate_group, agree_group)
        self._init_buffers()
        self._init_flags(fold_flags)
        self._device = self.buckets[0].params[0].device if self.buckets else torch.device("cpu")
        #: the global rank that owns chunk r (``reduce``'s destination)
        self._owners = (
            [
                r if process_group is None else dist.get_global_rank(process_group, r)
                for r in range(world_size)
            ]
            if collective == "reduce"
            else []
        )

    def _init_groups(
        self,
        process_group: dist.ProcessGroup | None,
        replicas: int,
        replicate_group: Callable[[], dist.ProcessGroup | None] | None,
        agree_group: Callable[[], dist.ProcessGroup | None] | None,
    ) -> None:
        """The groups the reductions and the flags' agreement run over, and the scale that turns
        a sum over them into a mean."""
        self._group = held_weakly(process_group)
        #: hybrid sharding: the shard groups holding the same chunks, and this rank's group of
        #: them (a getter: held weakly, ``groups.py``); a reduced chunk is averaged across them
        self.replicas = replicas
        self._replicate_group = replicate_group
        #: every rank training the module (the used-gradient flags are agreed over all of them)
        self._agree_group = agree_group or self._group
        #: which of the replicas this rank's shard group is (hybrid sharding), and, per bucket,
        #: whether its chunk holds a sum every replica holds alike (stage 1 accumulating): the
        #: replicas but the first drop it before adding the next pass, so that averaging across
        #: them counts it once
        self._replica_index = dist.get_rank() // self.world_size if replicas > 1 else 0
        self._holds_reduced = [False] * len(self.buckets)
        self._scale = 1.0 / (self.world_size * replicas)

    def _init_buffers(self) -> None:
        """Where gradients wait, per bucket, until their reduction is launched and completes."""
        self._filling: dict[int, torch.Tensor] = {}  # keep="shards": buffers not launched yet
        self._full: list[torch.Tensor | None] = [None] * len(self.buckets)  # keep="full"
        self._shards: list[torch.Tensor | None] = [None] * len(self.buckets)  # keep="shards"
        #: launched reductions, oldest first: (work, bucket, buffer, reduce-scatter output or None,
        #: the agreement whose flags ride in the buffer or None)
        self._in_flight: deque[tuple[Any, Bucket, torch.Tensor, torch.Tensor | None, Agreement | None]] = (
            deque()
        )
        #: hybrid sharding: reduced chunks being summed across the replicas, oldest first (work,
        #: bucket, buffer, reduce-scatter output or None)
        self._across: deque[tuple[Any, Bucket, torch.Tensor, torch.Tensor | None]] = deque()
        self._first_slot: list[int] = []  # a parameter's slot: its bucket's first + its index
        slots = 0
        for b in self.buckets:
            self._first_slot.append(slots)
            slots += len(b.params)
        # keep="shards": per buffer being filled, its parameters' views and which were filled
        self._views: dict[int, list[torch.Tensor]] = {}
        self._filled: dict[int, bytearray] = {}
        #: buckets of one parameter that splits evenly (a big embedding, typically): its
        #: gradient is reduced in place rather than copied into a second buffer
        self._in_place = [len(b.params) == 1 and b.padded == b.numel for b in self.buckets]
        self._used_here = bytearray(slots)  # parameters that added a gradient since the last agree()

    def _init_flags(self, fold_flags: bool) -> None:
        """Where the used-gradient flags are agreed: folded into the last bucket's all-reduce
        where they can ride in it (``folds_flags``), else in an all-reduce of their own."""
        #: the bucket whose all-reduce carries the used-gradient flags (-1: none; ``folds_flags``)
        self.fold_bucket = (
            len(self.buckets) - 1
            if fold_flags
            and self.keep == "shards"
            and self.collective == "all_reduce"
            and self.world_size > 1
            and self.replicas == 1  # (across replicas the flags are agreed over every rank)
            else -1
        )
        if self.fold_bucket >= 0:
            self._in_place[self.fold_bucket] = False  # its buffer needs room for the flags
        self._folded: Agreement | None = None  # the flags launched with the fold bucket
        self._globally_used: set[int] | None = None  # ... on any rank, since zero_grad

    # ----- filling buffers ---------------------------------------------------------------------
    def add(self, bucket: Bucket, i: int, grad: torch.Tensor) -> None:
        """Add parameter ``i`` of ``bucket``'s gradient (this rank's) into the bucket's buffer."""
        bi = bucket.index
        self._used_here[self._first_slot[bi] + i] = 1
        if self.keep == "full":
            dst = self._buffer(bucket)[bucket.offsets[i] : bucket.offsets[i] + grad.numel()]
            if self.world_size * self.replicas > 1:
                dst.add_(grad.reshape(-1), alpha=self._scale)
            else:
                dst.add_(grad.reshape(-1))
            return
        filled = self._filled.get(bi)
        if filled is None and self._in_place[bi] and grad.is_contiguous():
            self._filling[bi] = grad.view(-1)
            self._filled[bi] = bytearray(b"\x01")
            self._views[bi] = []
            self._observe(grad, "comm")
            return
        if filled is None:
            self._buffer(bucket)
            filled = self._filled[bi]
        views = self._views[bi]
        if not views:  # the in-place bucket, given a second gradient in the same pass: sum them
            self._filling[bi].view_as(grad).add_(grad)
            return
        view = views[i]
        if filled[i]:  # a second gradient in the same pass: sum them
            view.add_(grad)
        else:
            view.copy_(grad)
            filled[i] = 1

    def add_all(self, bucket: Bucket, grads: Sequence[torch.Tensor | None]) -> None:
        """``add`` for every parameter of ``bucket`` at once (None: no gradient). A fresh
        buffer whose parameters all have gradients is filled by one concatenation, not one copy
        per parameter: what a unit of many small tensors (norms, biases) costs."""
        fresh = self.keep == "shards" and bucket.index not in self._filling
        if fresh and len(grads) > 1 and all(g is not None for g in grads):
            bi = bucket.index
            base = self._first_slot[bi]
            self._used_here[base : base + len(grads)] = b"\x01" * len(grads)
            buf = self._empty(bucket)
            torch.cat([g.reshape(-1) for g in grads if g is not None], out=buf[: bucket.numel])  # type: ignore[union-attr]
            self._filling[bi] = buf
            self._filled[bi] = bytearray(b"\x01" * len(grads))
            self._views[bi] = []
            return
        for i, g in enumerate(grads):
            if g is not None:
                self.add(bucket, i, g)

    def _buffer(self, bucket: Bucket) -> torch.Tensor:
        """The bucket's buffer: stage 1's persistent one, or the one being filled (allocated
        uninitialised, with a view per parameter)."""
        bi = bucket.index
        if self.keep == "full":
            buf = self._full[bi]
            if buf is None:
                buf = self._zeros(bucket, "grads")
                self._full[bi] = buf
            if self._holds_reduced[bi]:  # accumulating: the chunk's sum so far counts once
                self._holds_reduced[bi] = False
                if self._replica_index:
                    buf[bucket.chunk_start : bucket.chunk_start + bucket.chunk].zero_()
            return buf
        buf = self._filling.get(bi)
        if buf is None:
            buf = self._empty(bucket)
            self._views[bi] = _views_like(buf[: bucket.numel], bucket.params)
            self._filled[bi] = bytearray(len(bucket.params))
            self._filling[bi] = buf
        return buf

    @property
    def folds_flags(self) -> bool:
        """Whether the used-gradient flags travel in the last bucket's all-reduce, rather than
        in an all-reduce of their own: on gloo each collective is a round trip, and a step of
        small buckets (a ResNet's norms, an LSTM's gates) spends a measurable share of its time
        on that one. The last bucket is then launched only once backward is over (every flag
        known), which is when its last gradient arrives anyway."""
        return self.fold_bucket >= 0

    def _size(self, bucket: Bucket) -> int:
        """Elements of ``bucket``'s buffer: its padded chunks, and the flags if it carries them."""
        return bucket.padded + (len(self._used_here) if bucket.index == self.fold_bucket else 0)

    def _empty(self, bucket: Bucket) -> torch.Tensor:
        first = bucket.params[0]
        buf = torch.empty(self._size(bucket), dtype=first.dtype, device=first.device)
        self._observe(buf, "comm")
        return buf

    def _zeros(self, bucket: Bucket, category: str) -> torch.Tensor:
        first = bucket.params[0]
        buf = torch.zeros(self._size(bucket), dtype=first.dtype, device=first.device)
        self._observe(buf, category)
        return buf

    def _observe(self, tensor: torch.Tensor, category: str) -> None:
        if self.memory_observer is not None:
            self.memory_observer(tensor, category)

    def _take_filled(self, bucket: Bucket) -> torch.Tensor:
        """keep="shards": the bucket's buffer, ready to reduce: regions no gradient reached and
        the padding zeroed, scaled by 1/N (a bucket without any gradient: zeros)."""
        bi = bucket.index
        buf = self._filling.pop(bi, None)
        if buf is None:
            return self._zeros(bucket, "comm")
        filled = self._filled.pop(bi)
        views = self._views.pop(bi)
        if views and not all(filled):
            for view, done in zip(views, filled, strict=True):
                if not done:
                    view.zero_()
        if bucket.padded > bucket.numel:
            buf[bucket.numel : bucket.padded].zero_()
        if self.world_size * self.replicas > 1:
            buf[: bucket.padded].mul_(self._scale)
        return buf

    # ----- reducing ----------------------------------------------------------------------------
    def launch(self, bucket: Bucket) -> None:
        """Start reducing ``bucket`` (zeros for parameters that added nothing)."""
        # Complete reductions only when the limit of reductions in flight would be exceeded (that
        # wait is what bounds the memory), never one because it has finished already: which ones
        # have would decide which buffers are alive when the next is allocated, and so the peak.
        while len(self._in_flight) >= self.max_in_flight:
            self._complete_oldest()
            while len(self._across) > self.max_in_flight:
                self._finish_across()
        buf = self._buffer(bucket) if self.keep == "full" else self._take_filled(bucket)
        work, out = None, None
        flags = None
        if bucket.index == self.fold_bucket:  # the flags ride along, summed (any rank's 1 stays > 0)
            local = list(self._used_here)
            flags = buf[bucket.padded :]
            flags.copy_(torch.tensor(local, dtype=flags.dtype, device=flags.device))
            self._used_here = bytearray(len(self._used_here))
        if self.world_size > 1:
            with profiled(f"shardbench::{self.label}::reduce"):
                if self.collective == "all_reduce":
                    work = dist.all_reduce(buf, group=self._group(), async_op=True)
                elif self.collective == "reduce":  # each chunk to its owner; the rest of buf is scratch
                    c = bucket.chunk
                    work = _Each(
                        dist.reduce(
                            buf[r * c : (r + 1) * c],
                            dst=self._owners[r],
                            group=self._group(),
                            async_op=True,
                        )
                        for r in range(self.world_size)
                    )
                else:
                    out = buf.new_empty(bucket.chunk)
                    kept = self.keep == "shards" and self._shards[bucket.index] is None
                    self._observe(out, "grads" if kept else "comm")
                    work = dist.reduce_scatter_tensor(out, buf, group=self._group(), async_op=True)
        folded = None
        if flags is not None:
            folded = self._folded = Agreement(work, flags, local, len(local), in_bucket=True)
        self._in_flight.append((work, bucket, buf, out, folded))

    def _start_across(
        self, reduced: torch.Tensor, bucket: Bucket, buf: torch.Tensor, out: torch.Tensor | None
    ) -> None:
        """Hybrid sharding: start summing ``reduced`` (this shard group's reduced chunk, already
        divided by every rank's count) across the shard groups holding the same chunk. It runs
        on the replicas' group while backward goes on and the next buckets reduce within the
        shard group; ``_finish_across`` completes it (at a launch past the bound, or ``drain``)."""
        assert self._replicate_group is not None
        with profiled(f"shardbench::{self.label}::reduce"):
            work = dist.all_reduce(reduced, group=self._replicate_group(), async_op=True)
        self._across.append((work, bucket, buf, out))

    def _finish_across(self) -> None:
        """Wait for the oldest replicas' all-reduce; its chunk becomes this rank's gradients."""
        work, bucket, buf, out = self._across.popleft()
        with profiled(f"shardbench::{self.label}::reduce"):
            work.wait()
        if self.keep == "full":
            self._holds_reduced[bucket.index] = True
        else:
            self._keep_reduced(bucket, buf, out)

    def drain(self) -> None:
        """Wait for every reduction in flight."""
        while self._in_flight:
            self._complete_oldest()
        while self._across:
            self._finish_across()

    def _complete_oldest(self) -> None:
        """Wait for the oldest reduction within the shard group; its result becomes (or is added
        to) this rank's chunk, or, across replicas, starts their all-reduce; what held it is
        freed (``release.py``) once nothing reads it."""
        work, bucket, buf, out, folded = self._in_flight.popleft()
        if work is not None:
            work.wait()
        start, end = bucket.chunk_start, bucket.chunk_start + bucket.chunk
        if self.keep == "full":
            if out is not None:
                buf[start:end].copy_(out)
                release(out)
            if self.world_size > 1:  # the other ranks' chunks: ready for the next backward
                buf[:start].zero_()
                buf[end:].zero_()
            if self.replicas > 1:
                self._start_across(buf[start:end], bucket, buf, None)
            return
        if folded is not None:  # the flags are read before their buffer goes
            folded.read()
        if self.replicas > 1:  # this pass's sum only: what the shard held before is alike everywhere
            if out is not None:  # the reduce-scatter's output is all that is read from here on
                release(buf)
            self._start_across(buf[start:end] if out is None else out, bucket, buf, out)
            return
        self._keep_reduced(bucket, buf, out)

    def _keep_reduced(self, bucket: Bucket, buf: torch.Tensor, out: torch.Tensor | None) -> None:
        """``keep="shards"``: the reduced chunk (``out``, or this rank's part of ``buf``) becomes
        or is added to this rank's gradient shard; the bucket buffer dies here."""
        start, end = bucket.chunk_start, bucket.chunk_start + bucket.chunk
        shard = self._shards[bucket.index]
        if out is None:  # all-reduced or reduced to owners (or one rank): this rank's chunk
            if shard is None:
                self._shards[bucket.index] = shard = buf[start:end].clone()
                self._observe(shard, "grads")
            else:
                shard.add_(buf[start:end])
        elif shard is None:  # the reduce-scatter's output is the shard
            self._shards[bucket.index] = out
        else:
            shard.add_(out)
            release(out)
        release(buf)

    def start_agreeing(self, extra: Sequence[int] = ()) -> Agreement:
        """Once every bucket of a backward pass is launched: start learning which parameters
        received a gradient on any rank (those no rank used get none, so the optimizer skips
        them exactly as a single process would), and the maximum over ranks of each of
        ``extra`` (flags the caller wants agreed). One small all-reduce, queued behind the
        buckets' reductions rather than after waiting for them: on gloo each wait-then-issue is
        a round trip of its own (where the flags ride in the last bucket's all-reduce,
        ``folds_flags``, that one is the agreement). ``agreed`` finishes it."""
        if self._folded is not None and not extra:
            agreement, self._folded = self._folded, None
            return agreement
        local = [*self._used_here, *extra]
        flags = torch.tensor(local, dtype=torch.int32, device=self._device)
        work = None
        if self.world_size * self.replicas > 1:
            with profiled(f"shardbench::{self.label}::reduce"):
                work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._agree_group(), async_op=True)
        self._used_here = bytearray(len(self._used_here))
        return Agreement(work, flags, local, len(local) - len(extra))

    def agreed(self, agreement: Agreement) -> list[int]:
        """Wait for ``agreement``; record the parameters used on any rank; the agreed extras."""
        values = agreement.read()
        if not agreement.in_bucket:
            release(agreement.flags)
        n = agreement.slots
        used = {k for k in range(n) if values[k]}
        self._globally_used = used if self._globally_used is None else self._globally_used | used
        return list(values[n:])

    # ----- what the optimizer sees (``ShardedOptimizer``'s gradient source) --------------------
    def gradient_chunk(self, bucket: int) -> torch.Tensor | None:
        """This rank's reduced gradient chunk of ``bucket`` (flat), or None before any."""
        if self._globally_used is None:
            return None
        if self.keep == "full":
            buf, b = self._full[bucket], self.buckets[bucket]
            return None if buf is None else buf[b.chunk_start : b.chunk_start + b.chunk]
        return self._shards[bucket]

    def received_gradient(self, bucket: int, param: int) -> bool:
        """Whether parameter ``param`` of ``bucket`` received a gradient on any rank."""
        used = self._globally_used
        return used is not None and self._first_slot[bucket] + param in used

    def on_zero_grad(self, set_to_none: bool) -> None:
        self._holds_reduced = [False] * len(self.buckets)
        if self.keep == "full":  # the buffers stay, as DDP's buckets do
            for buf in self._full:
                if buf is not None:
                    buf.zero_()
        elif set_to_none:
            self._shards = [None] * len(self._shards)
        else:
            for g in self._shards:
                if g is not None:
                    g.zero_()
        if set_to_none:
            self._globally_used = None

    # ----- state -------------------------------------------------------------------------------
    def holds_gradients(self) -> bool:
        """Gradients were reduced since the optimizer's last ``zero_grad(set_to_none=True)``."""
        return self._globally_used is not None

    def idle(self) -> bool:
        """No bucket buffer being filled and no reduction in flight (true between steps)."""
        return not self._filling and not self._in_flight and not self._views

    def memory_tensors(self) -> dict[str, list[torch.Tensor]]:
        """Tensors held now, by category: the gradients a rank keeps."""
        kept = self._full if self.keep == "full" else self._shards
        return {"grads": [g for g in kept if g is not None]}
