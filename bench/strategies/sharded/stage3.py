"""``ShardedDataParallel(module, sharded_optimizer, stage=3)``: ZeRO stage 3, parameters sharded
too, gathered per unit only while that unit runs.

The optimizer's buckets are re-packed so each holds one unit's parameters (per param group, see
``ShardedOptimizer.pack_by_units``) and each rank keeps its chunk of every bucket as a tensor of
its own; the optimizer steps those chunks in place and gathers nothing afterwards. A bucket's flat
buffer, of which the unit's parameters are views, keeps its metadata but has its *storage*
resized to zero between uses: parameters, and the views autograd saved of them for backward,
stay valid objects, and regain their values when the storage is refilled (FSDP's own technique).

A unit's life in a step:

1. pre-forward hook: all-gather its buckets into their flat buffers (``shardbench::zero3::gather``),
   or wait for that gather if a prefetch started it, and start the next unit's (``prefetch.py``:
   the unit that followed this one in the last forward; at most two units whole besides the root);
2. post-forward hook: free them, and hook its outputs' gradients (the root unit instead stays
   gathered into backward, which begins with it, as FSDP keeps its root);
3. the first gradient reaching one of its outputs re-gathers it (and prefetches the unit that ran
   before it), before any of its backward runs, so an activation-checkpointed unit's recompute
   (which calls no module hooks) finds its parameters there;
4. autograd's gradients of a unit are held as they come; when all of them are there, the unit's
   backward is over: its parameters are freed, then its gradients are copied into one flat
   buffer (after the previous unit's reduction is completed, so at most two units' full
   gradients exist) and reduce-scattered (the stage-2 machinery, ``shardbench::zero3::reduce``)
   into this rank's gradient shard while the next unit's backward runs;
5. at the end of backward (an autograd engine callback) buckets that got no gradient are reduced
   with zeros, units still gathered are freed, and, as in stage 2, parameters no rank used get
   no gradient at all.

Between uses a rank holds only its chunks: parameters, gradient shards, optimizer state (and fp32
masters for low-precision parameters), 16 Psi / N with fp32 AdamW.

Gradient accumulation, as in stage 2: backward passes between ``zero_grad`` calls each reduce
into the gradient shards, or ``with model.no_sync():`` keeps full local gradients (units are
still gathered and freed as usual) for the next synchronised backward to reduce.

Checkpoints: ``full_state_dict()`` consolidates the model (a collective; load it into the plain
module before wrapping, at any world size); the optimizer consolidates and loads as in stages
1-2, its state loaded *after* wrapping (wrapping re-packs the buckets, which needs them stateless).

Requirements, as FSDP's: every rank runs the same units in the same order (gathers are
collectives); a parameter's values are needed in backward only by the operations that produce
its gradient (true of ordinary layers; a weight used through ``.detach()`` or ``.data`` in a
saved computation is not). Frozen parameters are not sharded: they stay whole on every rank,
like buffers, since no gradient tells when backward is done with them.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function

from bench.strategies.sharded.data_parallel import ShardedDataParallel, _weakly
from bench.strategies.sharded.layout import Bucket
from bench.strategies.sharded.optimizer import ShardedOptimizer, global_rank
from bench.strategies.sharded.prefetch import UnitOrder
from bench.strategies.sharded.units import Unit, UnitPolicy, find_units
from bench.tensors import tensors_in


def _preserve_version(tensor: torch.Tensor) -> contextlib.AbstractContextManager[Any]:
    """Refilling a flat buffer must not bump its version counter: autograd saved views of the
    parameters in forward and would refuse them in backward as "modified by an inplace
    operation". A private torch API (FSDP2 uses it for the same purpose); without it, a no-op."""
    keep = getattr(torch.autograd, "_unsafe_preserve_version_counter", None)
    return keep(tensor) if keep is not None else contextlib.nullcontext()


class ShardedDataParallel3(ShardedDataParallel):
    """ZeRO-3 around ``module``: what ``ShardedDataParallel(..., stage=3)`` returns. See the
    module docstring; ``unit`` is the unit policy (``units.py``; None: the default)."""

    label = "zero3"
    #: a bucket here is a whole unit (a transformer layer), not 25 MB, so one reduction in
    #: flight overlaps the next unit's whole backward; it is completed before that unit's
    #: gradients are copied into their own buffer (``_buffer``), so at most two units' full
    #: gradients exist at once: one reducing, one being computed
    max_in_flight = 1

    def __init__(
        self,
        module: nn.Module,
        sharded_optimizer: ShardedOptimizer,
        *,
        stage: int = 3,
        unit: UnitPolicy | None = None,
        prefetch: bool = True,
        broadcast_buffers: bool = True,
    ) -> None:
        opt = sharded_optimizer
        # Start from identical weights (rank 0's), broadcast while they are still whole.
        if opt.world_size > 1:
            with torch.no_grad():
                for flat in opt.flats:
                    dist.broadcast(flat, src=global_rank(opt.process_group, 0), group=opt.process_group)
        units = find_units(module, unit, [p for b in opt.buckets for p in b.params])
        opt.pack_by_units([u.params for u in units], own_chunks=True)
        opt.gather_after_step = False
        super().__init__(module, opt, broadcast_buffers=broadcast_buffers)
        self.units: list[Unit] = units
        unit_of = {id(p): u.index for u in units for p in u.params}
        self._unit_of_bucket = [unit_of[id(b.params[0])] for b in opt.buckets]
        self._unit_buckets: list[list[int]] = [[] for _ in units]
        for bi, u in enumerate(self._unit_of_bucket):
            self._unit_buckets[u].append(bi)
        self._gathered: set[int] = set()  # units whose flat buffers hold their parameters
        #: start gathering the next unit while this one runs (see ``prefetch.py``)
        self.prefetch = prefetch
        self._order = UnitOrder()
        self._gathering: dict[int, list[Any]] = {}  # unit -> its gathers not yet waited for
        self._prefetched: set[int] = set()  # gathered ahead, not used yet
        self._launched: set[int] = set()  # buckets launched in this backward
        self._done: set[int] = set()  # units whose gradients are all reduced in this backward
        self._held: dict[int, list[tuple[int, torch.Tensor]]] = {}  # bucket -> gradients held until complete
        for u in units:
            self._free(u.index, force=True)
        self._module_hooks = [
            handle
            for u in units
            for handle in (
                u.module.register_forward_pre_hook(_weakly(self._pre_forward, u.index), prepend=True),
                u.module.register_forward_hook(_weakly(self._post_forward, u.index)),
            )
        ]

    def _start_identical(self) -> None:
        """Done in ``__init__``, before the buckets were re-packed by unit."""

    def close(self) -> None:
        super().close()
        for handle in self._module_hooks:
            handle.remove()
        self._module_hooks.clear()
        for u in list(self._gathered):
            self._free(u)

    # ----- gather and free ---------------------------------------------------------------------
    @torch.no_grad()
    def _gather(self, u: int, *, wait: bool = True) -> None:
        """Gather unit ``u`` (idempotent); ``wait=False`` only starts it (a prefetch)."""
        opt = self.optimizer
        with record_function("shardbench::zero3::gather"):
            if u not in self._gathered:
                works = []
                for bi in self._unit_buckets[u]:
                    flat, chunk = opt.flats[bi], opt.chunks[bi]
                    with _preserve_version(flat):
                        flat.untyped_storage().resize_(flat.numel() * flat.element_size())
                        if self.world_size > 1:
                            works.append(
                                dist.all_gather_into_tensor(
                                    flat, chunk, group=self.process_group, async_op=not wait
                                )
                            )
                        else:
                            flat.copy_(chunk)
                self._gathered.add(u)
                if not wait and self.world_size > 1:
                    self._gathering[u] = works
            if wait:
                for work in self._gathering.pop(u, []):
                    work.wait()

    def _free(self, u: int, *, force: bool = False) -> None:
        if u in self._gathered or force:
            for work in self._gathering.pop(u, []):  # never free what a gather still writes
                work.wait()
            for bi in self._unit_buckets[u]:
                self.optimizer.flats[bi].untyped_storage().resize_(0)
            self._gathered.discard(u)
            self._prefetched.discard(u)

    def _use(self, u: int) -> None:
        """Unit ``u`` is about to run: a prefetch that guessed another unit is freed (so at most
        two units are ever whole, besides the root), and ``u`` is gathered and waited for."""
        for other in self._prefetched - {u}:
            self._free(other)
        self._prefetched.discard(u)
        self._gather(u)

    def _prefetch(self, u: int | None) -> None:
        if not self.prefetch or u is None or u in self._gathered or u in self._done:
            return
        if len(self._gathered - {0}) >= 2:  # the bound: two units whole besides the root
            return
        self._gather(u, wait=False)
        self._prefetched.add(u)

    def gathered_units(self) -> list[str]:
        """Names of the units whose full parameters exist now ("" is the root)."""
        return [self.units[u].name for u in sorted(self._gathered)]

    # ----- hooks -------------------------------------------------------------------------------
    def _pre_forward(self, u: int, module: nn.Module, args: Any) -> None:
        if self.units[u].is_root:
            self._order.start()
            self._use(u)
            self._prefetch(self._order.first())
        else:
            self._order.ran(u)
            self._use(u)
            self._prefetch(self._order.after(u))

    def _post_forward(self, u: int, module: nn.Module, args: Any, output: Any) -> None:
        needs_grad = [t for t in tensors_in(output) if t.requires_grad] if torch.is_grad_enabled() else []
        for t in needs_grad:
            t.register_hook(_weakly(self._pre_backward, u))
        if self.units[u].is_root:
            self._order.finish()
            for other in list(self._prefetched):  # guessed, and no unit came
                self._free(other)
        if not (self.units[u].is_root and needs_grad):
            self._free(u)

    def _pre_backward(self, u: int, grad: torch.Tensor) -> None:
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
            self._callback_queued = True
        if u not in self._done:
            self._use(u)
            self._prefetch(self._order.before(u))

    def _on_grad(self, index: int, i: int, p: torch.Tensor) -> None:
        """Under ``no_sync`` the full gradient stays in ``p.grad`` (autograd sums the passes) for
        the next synchronised backward to reduce, as in stage 2; the unit's parameters are still
        freed as soon as all of its gradients are there."""
        if self._sync or p.grad is None:
            super()._on_grad(index, i, p)
            return
        self._pending[index] -= 1
        u = self._unit_of_bucket[index]
        if all(self._pending[b] == 0 for b in self._unit_buckets[u]):
            self._done.add(u)
            self._free(u)

    # ----- reduce: as stage 2, but each bucket as soon as it is complete -----------------------
    def _collect(self, bucket: Bucket, i: int, p: torch.Tensor) -> None:
        """A bucket keeps autograd's gradients until it is complete, and only then are they
        copied into its flat buffer (``_release_held``), as FSDP2 copies in at a unit's
        post-backward. A buffer allocated at a unit's first gradient would hold a whole unit's
        gradients through that unit's backward, where the activation peak is: bert-base,
        simulated N=8, batch 2, the peak fell from 562.8 to 562.0 MiB (and to 554.1 with the
        parameters freed before the copy-in, ``_launch_ready``). The root matters most:
        its parameters are used at both ends of forward (BERT: embeddings first, pooler and
        head last), so a buffer allocated at its first gradient would live through all of
        backward (93 MiB, a fifth of bert-base; 651 -> 560 MiB without prefetch)."""
        # Buffers of finished reductions go now, not at the next launch: between two launches
        # lies a whole unit's backward, with the activation peak in it.
        self._release_finished()
        self._held.setdefault(bucket.index, []).append((i, p))

    def _buffer(self, bucket: Bucket) -> torch.Tensor:
        if bucket.index not in self._buffers:
            while self._in_flight:  # its buffer goes before the next one is allocated
                self._complete_oldest()
        return super()._buffer(bucket)

    def _release_held(self, bucket: Bucket) -> None:
        for i, p in self._held.pop(bucket.index, []):
            super()._collect(bucket, i, p)

    def _launch_ready(self) -> None:
        """Launch complete buckets at once, not in bucket order: buckets follow units here. Ranks
        still launch in the same order, since they run the same units in the same order. A unit
        whose buckets are all complete has finished its backward, so its parameters are freed
        *before* its gradients are copied into flat buffers, not after: the copy-in is the
        moment both a unit's gradients and their buffer exist."""
        buckets = self.optimizer.buckets
        for bi in sorted(self._ready - self._launched):
            u = self._unit_of_bucket[bi]
            if all(b in self._ready for b in self._unit_buckets[u]):
                self._done.add(u)
                self._free(u)
            self._release_held(buckets[bi])
            self._launch(buckets[bi])
            self._launched.add(bi)

    def _flush(self) -> None:
        for b in self.optimizer.buckets:
            if b.index not in self._launched:
                self._collect_leftovers(b)
                self._release_held(b)
                self._buffer(b)  # params without a gradient contribute zeros
                self._ready.add(b.index)
        self._launch_ready()

    def _finish_backward(self) -> None:
        if self._sync:
            super()._finish_backward()
        else:  # nothing is reduced: the gradients wait, whole, for a synchronised backward
            self._pending = [len(b.params) for b in self.optimizer.buckets]
            self._callback_queued = False
        for u in list(self._gathered):  # gathered in backward, yet no gradient came
            self._free(u)
        self._launched.clear()
        self._done.clear()

    # ----- state and accounting ----------------------------------------------------------------
    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The module's state dict with whole parameters, on every rank (a collective: call it on
        every rank). Units are gathered one at a time, so beside the result a rank holds at most
        one unit's full parameters."""
        state = self.module.state_dict()
        names: dict[int, list[str]] = {}
        for name, p in self.module.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(name)
        for u in self.units:
            was_gathered = u.index in self._gathered
            self._gather(u.index)
            for p in u.params:
                value = p.detach().clone()
                for name in names.get(id(p), []):
                    state[name] = value
            if not was_gathered:
                self._free(u.index)
        return state

    def memory_tensors(self) -> dict[str, list[torch.Tensor]]:
        """Tensors held now, by category: gradient shards, and this rank's parameter chunks
        ("params": they are the parameters a rank keeps; gathered flat buffers are the module's
        parameters' storage, which the memory tracker already counts as parameters)."""
        return {**super().memory_tensors(), "params": list(self.optimizer.chunks)}
