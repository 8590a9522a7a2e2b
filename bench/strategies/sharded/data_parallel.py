"""``ShardedDataParallel``: ZeRO stage 2, gradients reduced to their owners and sharded.

Wraps a module whose parameters a ``ShardedOptimizer`` has already packed into flat buckets.
During backward, as each parameter's gradient is accumulated, a hook copies it into its bucket's
flat gradient buffer and drops ``param.grad`` at once. When a bucket is complete it is
reduce-scattered (asynchronously, overlapping the rest of backward) so each rank receives the
sum for its own chunk only, which it keeps as its gradient shard; the bucket buffer is freed as
soon as its reduction completes. No rank ever holds a full set of gradients: at any time it
holds its gradient shards (1/N), the few buckets in flight, and the gradients autograd has just
produced.

Buckets are launched strictly in bucket order on every rank (a ready bucket waits for earlier
ones), so collectives match across ranks even when ranks produce gradients in different orders.
At the end of backward (an autograd engine callback) any bucket not yet launched is launched with
zeros for parameters that got no gradient, and a small all-reduce of "used" flags tells which
parameters received no gradient on any rank: those get no gradient at all, so the optimizer skips
them exactly as it would in a single process.

Nothing here keeps the process group alive (see ``optimizer.default_as_none`` for why that
matters): the default group is never held, the optimizer and the parameters' hooks reach this
wrapper only through weak references (dropping it frees it at once), every reduction is waited
before backward ends, and ``close()`` waits for any a failed backward left in flight and removes
the hooks.

Gradient accumulation works two ways: backward passes without ``zero_grad`` in between add into
the shards (reduced every pass, memory stays sharded), or ``with model.no_sync():`` keeps full
local gradients, DDP-style, and the next synchronised backward reduces their sum.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function

from bench.strategies.sharded.fake import is_fake
from bench.strategies.sharded.layout import Bucket
from bench.strategies.sharded.optimizer import ShardedOptimizer, global_rank

#: buckets whose reduction may be in flight at once before backward waits for the oldest.
MAX_IN_FLIGHT = 2


def _weakly(method: Callable[..., None], *first: Any, required: str = "") -> Callable[..., None]:
    """``method`` (with ``first`` as its leading arguments), called through a weak reference to
    its object. The optimizer and the parameters keep these callbacks; bound methods there would
    be reference cycles (through the parameters' hook dicts, which the garbage collector cannot
    traverse), keeping the wrapper, the model and any process group it holds alive for good. Once
    the object is gone the callback does nothing, or raises ``required`` when that is given."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> None:
        bound = ref()
        if bound is not None:
            bound(*first, *args)
        elif required:
            raise RuntimeError(required)

    return call


class ShardedDataParallel(nn.Module):
    """Gradient sharding (ZeRO-2) around ``module``; pair it with the ``ShardedOptimizer``
    that packed ``module``'s parameters. See the module docstring for the design.

    ``stage=3`` also shards the parameters, gathered per unit when used (``unit``: which modules
    are gathered together, see ``units.py``); that is ``stage3.ShardedDataParallel3``, a
    subclass returned by this same constructor."""

    #: names the profiler labels (``shardbench::<label>::reduce``)
    label = "zero2"
    #: reductions in flight before backward waits for the oldest (each holds a bucket buffer)
    max_in_flight = MAX_IN_FLIGHT

    def __new__(
        cls,
        module: nn.Module | None = None,
        sharded_optimizer: ShardedOptimizer | None = None,
        *,
        stage: int = 2,
        **kwargs: Any,
    ) -> ShardedDataParallel:
        if stage not in (2, 3):
            raise ValueError(
                f"ShardedDataParallel stage must be 2 or 3, got {stage!r} (stage 1 is a ShardedOptimizer "
                "with plain DistributedDataParallel)"
            )
        if stage == 2 and (stage3_only := sorted({"unit", "prefetch"} & set(kwargs))):
            raise ValueError(
                f"{', '.join(stage3_only)}: stage 3 options (stage 2 does not shard parameters); pass stage=3"
            )
        if stage == 3 and cls is ShardedDataParallel:
            from bench.strategies.sharded.stage3 import ShardedDataParallel3

            cls = ShardedDataParallel3
        return super().__new__(cls)

    def __init__(
        self,
        module: nn.Module,
        sharded_optimizer: ShardedOptimizer,
        *,
        stage: int = 2,
        broadcast_buffers: bool = True,
    ) -> None:
        super().__init__()  # (``stage`` was checked by __new__, which chose the class)
        self.module = module
        self.optimizer = sharded_optimizer
        self.broadcast_buffers = broadcast_buffers
        self.process_group = sharded_optimizer.process_group  # None: the default group, never held
        self.world_size = sharded_optimizer.world_size
        self._src = global_rank(self.process_group, 0)
        # gloo's reduce-scatter is ~2x slower than its all-reduce (25 MB at N=2: 36.5 ms vs
        # 18.9 ms, measured), so on gloo each bucket is all-reduced in place and every rank keeps
        # its chunk: the same memory (the bucket buffer exists either way), less time.
        self.reduce = "all_reduce" if dist.get_backend(self.process_group) == "gloo" else "reduce_scatter"
        buckets = sharded_optimizer.buckets
        # Allocated by the first reduction after zero_grad(set_to_none=True), freed by it: the
        # forward pass, where activations peak, then holds no gradient memory at all.
        self._grad_shards: list[torch.Tensor | None] = [None] * len(buckets)
        #: memory accounting observer: called with each tensor allocated here and its category
        #: ("grads" for gradient shards, "comm" for communication buffers).
        self.memory_observer: Callable[[torch.Tensor, str], None] | None = None
        self._buffers: dict[int, torch.Tensor] = {}
        self._pending = [len(b.params) for b in buckets]
        self._ready: set[int] = set()
        self._next = 0
        self._in_flight: list[tuple[Any, Bucket, torch.Tensor, torch.Tensor | None]] = []
        self._slot: dict[nn.Parameter, int] = {}  # index into the "used" flags
        for b in buckets:
            for p in b.params:
                self._slot[p] = len(self._slot)
        self._used = torch.zeros(
            len(self._slot), dtype=torch.int32, device=buckets[0].params[0].device if buckets else "cpu"
        )
        self._used_here: set[int] = set()  # slots used in this backward, on this rank
        self._globally_used: set[int] | None = None  # slots used on any rank since zero_grad
        self._sync = True
        self._callback_queued = False
        sharded_optimizer.label = self.label
        sharded_optimizer.layout_locked_by = "ShardedDataParallel"
        sharded_optimizer.grad_source = _weakly(
            self._grads_from_shards,
            required="the ShardedDataParallel that holds this optimizer's gradients is gone: "
            "keep a reference to it for as long as you train",
        )
        self._zero_grad_hook = _weakly(self._on_zero_grad)
        sharded_optimizer.zero_grad_hooks.append(self._zero_grad_hook)
        self._start_identical()
        self._hook_handles = [
            p.register_post_accumulate_grad_hook(_weakly(self._on_grad, b.index, i))
            for b in buckets
            for i, p in enumerate(b.params)
        ]

    def _start_identical(self) -> None:
        """Start from identical weights, as DDP does: rank 0's, broadcast."""
        if self.world_size > 1:
            with torch.no_grad():
                for flat in self.optimizer.flats:
                    dist.broadcast(flat, src=self._src, group=self.process_group)

    def close(self) -> None:
        """End of training, before ``dist.destroy_process_group``: wait for any reduction still
        in flight (a backward that raised leaves its launched buckets so), remove the gradient
        hooks and detach from the optimizer. The wrapper reduces nothing afterwards."""
        while self._in_flight:
            self._complete_oldest()
        self._callback_queued = False
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles.clear()
        if self._zero_grad_hook in self.optimizer.zero_grad_hooks:
            self.optimizer.zero_grad_hooks.remove(self._zero_grad_hook)

    # ----- forward -----------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.broadcast_buffers and self.world_size > 1:
            with torch.no_grad():
                for buf in self.module.buffers():
                    dist.broadcast(buf, src=self._src, group=self.process_group)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate full local gradients without communication (DDP semantics)."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    # ----- backward: bucket, reduce, shard -----------------------------------------------------
    def _on_grad(self, index: int, i: int, p: torch.Tensor) -> None:
        """Post-accumulate-grad hook of parameter ``i`` of bucket ``index``."""
        if not self._sync or p.grad is None:
            return
        bucket = self.optimizer.buckets[index]
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
            self._callback_queued = True
        self._collect(bucket, i, p)
        self._used[self._slot[p]] = 1
        self._used_here.add(self._slot[p])
        self._pending[bucket.index] -= 1
        if self._pending[bucket.index] == 0:
            self._ready.add(bucket.index)
            self._launch_ready()

    def _collect(self, bucket: Bucket, i: int, p: torch.Tensor) -> None:
        """Move parameter ``i``'s gradient into its bucket's buffer and drop ``p.grad``."""
        assert p.grad is not None
        if len(bucket.params) == 1 and bucket.padded == p.numel() and p.grad.is_contiguous():
            # A bucket of one parameter that splits evenly (a big embedding, typically):
            # reduce its gradient in place rather than copy it into a second buffer.
            self._buffers[bucket.index] = p.grad.view(-1)
            self._observe(p.grad, "comm")
        else:
            off = bucket.offsets[i]
            self._buffer(bucket)[off : off + p.numel()].copy_(p.grad.reshape(-1))
        p.grad = None  # the full gradient is not kept: this is what stage 2 saves

    def _buffer(self, bucket: Bucket) -> torch.Tensor:
        buf = self._buffers.get(bucket.index)
        if buf is None:
            first = bucket.params[0]
            buf = torch.zeros(bucket.padded, dtype=first.dtype, device=first.device)
            self._observe(buf, "comm")
            self._buffers[bucket.index] = buf
        return buf

    def _observe(self, tensor: torch.Tensor, category: str) -> None:
        if self.memory_observer is not None:
            self.memory_observer(tensor, category)

    def _launch_ready(self) -> None:
        buckets = self.optimizer.buckets
        while self._next < len(buckets) and self._next in self._ready:
            self._launch(buckets[self._next])
            self._next += 1

    def _launch(self, bucket: Bucket) -> None:
        # Release reductions that have finished, without waiting; block only when the limit
        # of buckets in flight would be exceeded (that wait is what bounds the memory).
        self._release_finished()
        while len(self._in_flight) >= self.max_in_flight:
            self._complete_oldest()
        buf = self._buffers.pop(bucket.index)
        work, out = None, None
        with record_function(f"shardbench::{self.label}::reduce"):
            if self.world_size > 1:
                buf.div_(self.world_size)  # average, as DDP does (pre-divided, then summed)
                if self.reduce == "all_reduce":
                    work = dist.all_reduce(buf, group=self.process_group, async_op=True)
                else:
                    out = buf.new_empty(bucket.chunk)
                    self._observe(out, "grads" if self._grad_shards[bucket.index] is None else "comm")
                    work = dist.reduce_scatter_tensor(out, buf, group=self.process_group, async_op=True)
        self._in_flight.append((work, bucket, buf, out))

    def _release_finished(self) -> None:
        """Complete the reductions that have finished, oldest first, without waiting."""
        while self._in_flight and (self._in_flight[0][0] is None or self._in_flight[0][0].is_completed()):
            self._complete_oldest()

    def _complete_oldest(self) -> None:
        """Wait for the oldest reduction; its result becomes (or is added to) the bucket's
        gradient shard, and the bucket buffer dies here."""
        work, bucket, buf, out = self._in_flight.pop(0)
        if work is not None:
            work.wait()
        shard = self._grad_shards[bucket.index]
        if out is None:  # all-reduced (or one rank): this rank's chunk of the whole bucket
            out = buf[bucket.chunk_start : bucket.chunk_start + bucket.chunk]
            if shard is None:
                out = out.clone()
                self._observe(out, "grads")
        if shard is None:
            self._grad_shards[bucket.index] = out
        else:
            shard.add_(out)

    def _finish_backward(self) -> None:
        """End of backward: flush every bucket in order, then agree on which params were used."""
        with record_function(f"shardbench::{self.label}::reduce"):
            self._flush()
            while self._in_flight:
                self._complete_oldest()
            used = self._used.clone()
            if self.world_size > 1:
                dist.all_reduce(used, op=dist.ReduceOp.MAX, group=self.process_group)
        used_slots = self._used_slots(used)
        prev = self._globally_used
        self._globally_used = used_slots if prev is None else prev | used_slots
        self._used.zero_()
        self._used_here.clear()
        self._pending = [len(b.params) for b in self.optimizer.buckets]
        self._ready.clear()
        self._next = 0
        self._callback_queued = False

    def _flush(self) -> None:
        """Launch every bucket not launched yet, in bucket order (the same on every rank)."""
        for b in self.optimizer.buckets[self._next :]:
            self._collect_leftovers(b)
            self._buffer(b)  # params without a gradient contribute zeros
            self._ready.add(b.index)
        self._launch_ready()

    def _collect_leftovers(self, bucket: Bucket) -> None:
        """Collect gradients a ``no_sync`` pass left in ``p.grad`` for parameters that this
        synchronised pass did not use (no hook collected them): they belong in the sum too."""
        for i, p in enumerate(bucket.params):
            if p.grad is not None:
                self._collect(bucket, i, p)
                self._used[self._slot[p]] = 1
                self._used_here.add(self._slot[p])

    def _used_slots(self, used: torch.Tensor) -> set[int]:
        """The slots flagged in the all-reduced ``used`` tensor. Under FakeTensorMode (planning
        with ``--fake``) its values do not exist; the world is then a fake one, in which no
        other rank contributes, so this rank's own record of what it used is the answer."""
        if is_fake(used):
            return set(self._used_here)
        return set(used.nonzero().flatten().tolist())

    # ----- what the optimizer sees -------------------------------------------------------------
    def _grads_from_shards(self) -> None:
        used = self._globally_used
        for b, shards, gshard in zip(
            self.optimizer.buckets, self.optimizer._shards, self._grad_shards, strict=True
        ):
            for pc, shard in zip(b.pieces, shards, strict=True):
                p = b.params[pc.param_index]
                if gshard is None or used is None or self._slot[p] not in used:
                    shard.grad = None
                    continue
                g = gshard[pc.chunk_offset : pc.chunk_offset + pc.numel]
                shard.grad = g if g.dtype == shard.dtype else g.to(shard.dtype)

    def _on_zero_grad(self, set_to_none: bool) -> None:
        if set_to_none:
            self._grad_shards = [None] * len(self._grad_shards)
            self._globally_used = None
        else:
            for g in self._grad_shards:
                if g is not None:
                    g.zero_()

    def memory_tensors(self) -> dict[str, list[torch.Tensor]]:
        """Tensors held now, by category, for memory accounting: the gradient shards."""
        return {"grads": [g for g in self._grad_shards if g is not None]}
