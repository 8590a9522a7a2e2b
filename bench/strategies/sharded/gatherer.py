"""``UnitGatherer``: stage 3's parameters, whole only while their unit runs.

Each unit's parameters live in flat buffers (the trainable ones one per param group,
``ShardedOptimizer.shard_parameters``; the frozen ones, which the optimizer never sees, one per
dtype in a ``FrozenShards`` the gatherer keeps, ``frozen.py``) whose *storage* is resized to
zero between uses, while the buffers keep their metadata: parameters, and the views autograd
saved of them for backward, stay valid objects and regain their values when the storage is
refilled (FSDP's own technique). A unit's frozen buffers are gathered and freed exactly when its
trainable ones are: a frozen weight is needed in forward, in backward for its inputs' gradients,
and in an activation-checkpointed unit's recompute.

A unit's life in a step:

1. pre-forward hook: all-gather its buffers (``shardbench::zero3::gather``), or wait for that
   gather if a prefetch started it, and start the next unit's (``prefetch.py``: the unit that
   followed this one in the last forward; at most two units whole besides the root). Its
   inputs that need a gradient pass through an identity autograd function whose backward says
   that the unit's backward is over;
2. post-forward hook: free it, and hook its outputs' gradients (the root unit instead stays
   gathered into backward, which begins with it, as FSDP keeps its root);
3. the first gradient reaching one of its outputs re-gathers it (and prefetches the unit that
   ran before it), before any of its backward runs, so an activation-checkpointed unit's
   recompute (which calls no module hooks) finds its parameters there;
4. when the gradients of its inputs are computed (the identity's backward, once per call of the
   unit in forward), its backward is over: it is freed and ``unit_backward_done`` is called;
5. ``finish_backward`` (at the end of backward) frees whatever is still gathered and names the
   units whose backward did not end that way (the root; a unit whose inputs need no gradient),
   for the caller to finish.

Every decision here follows the order in which units run and gradients reach their outputs
and inputs, never which parameters received gradients: that may differ between ranks (a
branch used by one rank's data only), and the all-gathers are collectives that every rank
must issue in the same order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardbench.strategies.sharded.free_parameter import make_freeable, make_plain, set_freed
from shardbench.strategies.sharded.frozen import FrozenShards
from shardbench.strategies.sharded.layout import remember_whole_shape
from shardbench.strategies.sharded.optimizer import ShardedOptimizer
from shardbench.strategies.sharded.prefetch import UnitOrder
from shardbench.strategies.sharded.profiling import profiled
from shardbench.strategies.sharded.units import Unit
from shardbench.strategies.sharded.weak import weakly
from shardbench.tensors import plain_tensors_in, replace_tensors, tensors_in


def _preserve_version(tensor: torch.Tensor) -> contextlib.AbstractContextManager[Any]:
    """Refilling a flat buffer must not bump its version counter: autograd saved views of the
    parameters in forward and would refuse them in backward as "modified by an inplace
    operation". A private torch API (FSDP2 uses it for the same purpose); without it, a no-op."""
    keep = getattr(torch.autograd, "_unsafe_preserve_version_counter", None)
    return keep(tensor) if keep is not None else contextlib.nullcontext()


class _BackwardOver(torch.autograd.Function):
    """Identity on a unit's inputs; its backward runs once every gradient the unit sends to its
    inputs is computed, which is when that unit's backward is over."""

    @staticmethod
    def forward(ctx: Any, done: Callable[[], None], *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.done = done
        return inputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        ctx.done()
        return (None, *grads)


def _places(bucket: Any, flat: torch.Tensor) -> list[tuple[nn.Parameter, torch.Tensor, int, torch.Size]]:
    return [(p, flat, off, p.shape) for p, off in zip(bucket.params, bucket.offsets, strict=True)]


def _needs_grad(t: torch.Tensor) -> bool:
    return t.requires_grad


class UnitGatherer:
    """Gathers and frees ``units``' parameters, trainable and frozen, around their forward and
    backward (see the module docstring). ``backward_started`` is called at the first gradient that reaches a
    unit's output in a backward pass, ``unit_backward_done(u)`` when unit ``u``'s is over (it
    has been freed)."""

    def __init__(
        self,
        units: list[Unit],
        optimizer: ShardedOptimizer,
        *,
        prefetch: bool,
        backward_started: Callable[[], None],
        unit_backward_done: Callable[[int], None],
    ) -> None:
        self.units = units
        self.optimizer = optimizer
        self.world_size = optimizer.world_size
        #: start gathering the next unit while this one runs (see ``prefetch.py``)
        self.prefetch = prefetch
        self._backward_started = backward_started
        self._unit_backward_done = unit_backward_done
        self._index_buckets(units, optimizer)
        #: the units' frozen parameters: no business of the optimizer, which owns only what it
        #: optimizes, but sharded, gathered and freed here with their unit's
        self.frozen = FrozenShards(units, world_size=self.world_size, rank=optimizer.rank)
        self._place_parameters(units, optimizer)
        #: while set (``pinned``), every unit stays gathered: nothing is freed
        self._pinned = False
        self._order = UnitOrder()
        self._gathered: set[int] = set()  # units whose flat buffers hold their parameters
        self._gathering: dict[int, list[Any]] = {}  # unit -> its gathers not yet waited for
        self._prefetched: set[int] = set()  # gathered ahead, not used yet
        self._calls = [0] * len(units)  # calls in forward whose backward is not over yet
        self._done: set[int] = set()  # units whose backward is over in this backward pass
        #: calls of the root now running: a root may call itself inside its forward (a
        #: LightningModule's training_step calls ``self(x)``); only the outermost call starts and
        #: ends a forward pass, so the recorded unit order survives and the root stays whole
        self._root_depth = 0
        for u in units:
            self.free(u.index, force=True)
        self._hook(units)

    def _index_buckets(self, units: list[Unit], optimizer: ShardedOptimizer) -> None:
        unit_of = {id(p): u.index for u in units for p in u.params}
        #: the unit each of the optimizer's buckets belongs to, and each unit's buckets
        self.unit_of_bucket = [unit_of[id(b.params[0])] for b in optimizer.buckets]
        self.unit_buckets: list[list[int]] = [[] for _ in units]
        for bi, u in enumerate(self.unit_of_bucket):
            self.unit_buckets[u].append(bi)

    def _place_parameters(self, units: list[Unit], optimizer: ShardedOptimizer) -> None:
        """Where each unit's parameters live in the flat buffers, and what each is between uses."""
        #: per unit, each parameter it gathers with the flat buffer it lives in, its offset
        #: there and its shape: what it is pointed back at once its buffer holds values again
        self._places: list[list[tuple[nn.Parameter, torch.Tensor, int, torch.Size]]] = [[] for _ in units]
        for bi, u in enumerate(self.unit_of_bucket):
            self._places[u] += _places(optimizer.buckets[bi], optimizer.flats[bi])
        for u in units:
            for i in self.frozen.unit_buckets[u.index]:
                self._places[u.index] += _places(self.frozen.buckets[i], self.frozen.flats[i])
        #: what each parameter is between uses: empty, and of a shape (0, k) of its own, so
        #: that no two of them compare equal (``torch.equal``: a fine-tuning callback skips a
        #: parameter equal to one the optimizer already has)
        self._empty: dict[int, torch.Tensor] = {}
        for places in self._places:
            for p, _, _, shape in places:
                remember_whole_shape(p, shape)
                make_freeable(p)
                self._empty[id(p)] = torch.empty((0, len(self._empty) + 1), dtype=p.dtype, device=p.device)

    def _hook(self, units: list[Unit]) -> None:
        #: the forward hooks on the units' modules (a deep copy of the module strips them)
        self.hook_fns: list[Callable[..., Any]] = []
        self._hooks = []
        for u in units:
            pre, post = weakly(self._pre_forward, u.index), weakly(self._post_forward, u.index)
            self.hook_fns += [pre, post]
            self._hooks += [
                u.module.register_forward_pre_hook(pre, prepend=True, with_kwargs=True),
                u.module.register_forward_hook(post),
            ]

    def close(self) -> None:
        """Remove the hooks and free every unit. A parameter given whole values of its own
        meanwhile (a trainer's teardown writes the consolidated state into the module) is a
        plain parameter again; the others keep refusing reads: their values are gone."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        for u in list(self._gathered):
            self.free(u)
        for places in self._places:
            for p, _, _, shape in places:
                if p.numel() == shape.numel():
                    make_plain(p)

    @torch.no_grad()
    def unshard(self) -> None:
        """Close, leaving every parameter whole in storage of its own (a collective): for laying
        the module out again. Unit by unit, but the module ends whole on every rank."""
        self.close()
        for u in self.units:
            self.gather(u.index)
            for p, _, _, _ in self._places[u.index]:
                p.data = p.detach().clone()
                make_plain(p)
            self._gathered.discard(u.index)
            for flat, _ in self._buffers(u.index):
                flat.untyped_storage().resize_(0)

    # ----- gather and free ---------------------------------------------------------------------
    def _buffers(self, u: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Unit ``u``'s (flat buffer, this rank's chunk) pairs: trainable, then frozen."""
        opt = self.optimizer
        trainable = [(opt.flats[bi], opt.chunks[bi]) for bi in self.unit_buckets[u]]
        return trainable + self.frozen.buffers(u)

    @torch.no_grad()
    def gather(self, u: int, *, wait: bool = True) -> None:
        """Gather unit ``u`` (idempotent); ``wait=False`` only starts it (a prefetch)."""
        with profiled("shardbench::zero3::gather"):
            if u not in self._gathered:
                works = []
                for flat, chunk in self._buffers(u):
                    with _preserve_version(flat):
                        flat.untyped_storage().resize_(flat.numel() * flat.element_size())
                        if self.world_size > 1:
                            works.append(
                                dist.all_gather_into_tensor(
                                    flat, chunk, group=self.optimizer.process_group, async_op=not wait
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
                self.frozen.release_chunks(u)  # a copy of part of the whole now (frozen.py)
                for p, flat, offset, shape in self._places[u]:
                    p.data = flat[offset : offset + shape.numel()].view(shape)
                    set_freed(p, False)

    def free(self, u: int, *, force: bool = False) -> None:
        if self._pinned and not force:
            return
        if u in self._gathered or force:
            for work in self._gathering.pop(u, []):  # never free what a gather still writes
                work.wait()
            self.frozen.restore_chunks(u)
            # Between uses a parameter is an empty tensor, never its full shape over a storage
            # of zero bytes (a read past the end of a freed storage kills the process), and
            # it refuses reads of its values (``free_parameter.py``: an empty tensor's sum is a
            # silent 0). Autograd saved the parameter itself, not its data: it sees the full
            # view again once the unit is gathered for its backward.
            for p, _, _, _ in self._places[u]:
                p.data = self._empty[id(p)]
                set_freed(p, True)
            for flat, _ in self._buffers(u):
                flat.untyped_storage().resize_(0)
            self._gathered.discard(u)
            self._prefetched.discard(u)

    @contextlib.contextmanager
    def pinned(self) -> Iterator[None]:
        """Every unit gathered, and kept so (forward passes inside free nothing), until the end
        of the block; then those not gathered before are freed. A collective: every rank enters
        it. What the block wrote into the parameters is kept: the trainable chunks and their
        fp32 masters are re-read from the whole buffers where they differ (frozen chunks are
        cut again from them when freed)."""
        if self._pinned:
            yield
            return
        before = set(self._gathered)
        for u in self.units:
            self.gather(u.index)
        self._pinned = True
        try:
            yield
        finally:
            self._pinned = False
            self.optimizer.adopt_whole_values()
            for u in self.units:
                if u.index not in before:
                    self.free(u.index)

    def _use(self, u: int) -> None:
        """Unit ``u`` is about to run: a prefetch that guessed another unit is freed (so at most
        two units are ever whole, besides the root), and ``u`` is gathered and waited for."""
        for other in self._prefetched - {u}:
            self.free(other)
        self._prefetched.discard(u)
        self.gather(u)

    def _prefetch(self, u: int | None) -> None:
        if not self.prefetch or u is None or u in self._gathered or u in self._done:
            return
        if len(self._gathered - {0}) >= 2:  # the bound: two units whole besides the root
            return
        self.gather(u, wait=False)
        self._prefetched.add(u)

    def gathered_units(self) -> list[str]:
        """Names of the units whose full parameters exist now ("" is the root)."""
        return [self.units[u].name for u in sorted(self._gathered)]

    # ----- hooks -------------------------------------------------------------------------------
    def _pre_forward(self, u: int, module: nn.Module, args: Any, kwargs: Any) -> Any:
        if self.units[u].is_root:
            self._root_depth += 1
            if self._root_depth == 1:
                self._order.start()
                self._use(u)
                self._prefetch(self._order.first())
            return None
        self._order.ran(u)
        self._use(u)
        self._prefetch(self._order.after(u))
        if not torch.is_grad_enabled():
            return None
        inputs = [t for t in plain_tensors_in((args, kwargs)) if t.requires_grad]
        if not inputs:  # nothing to tell when its backward is over: finish_backward will
            return None
        self._calls[u] += 1
        passed = iter(_BackwardOver.apply(weakly(self._inputs_done, u), *inputs))
        return replace_tensors((args, kwargs), passed, _needs_grad)

    def _post_forward(self, u: int, module: nn.Module, args: Any, output: Any) -> None:
        needs_grad = [t for t in tensors_in(output) if t.requires_grad] if torch.is_grad_enabled() else []
        for t in needs_grad:
            t.register_hook(weakly(self._pre_backward, u))
        if self.units[u].is_root:
            self._root_depth = max(0, self._root_depth - 1)
            if self._root_depth:  # an inner call of the root: the outer one is still running
                return
            self._order.finish()
            for other in list(self._prefetched):  # guessed, and no unit came
                self.free(other)
        if not (self.units[u].is_root and needs_grad):
            self.free(u)

    def _pre_backward(self, u: int, grad: torch.Tensor) -> None:
        self._backward_started()
        if u not in self._done:
            self._use(u)
            self._prefetch(self._order.before(u))

    def _inputs_done(self, u: int) -> None:
        self._calls[u] -= 1
        if self._calls[u] == 0 and u not in self._done:
            self._done.add(u)
            self.free(u)
            self._unit_backward_done(u)

    def finish_backward(self) -> list[int]:
        """End of a backward pass: free every unit still gathered and return, in unit order,
        the units whose backward did not end by their inputs' gradients (the root among
        them). Every rank returns the same list: it follows the order units ran, not which
        parameters received gradients."""
        rest = [u.index for u in self.units if u.index not in self._done]
        for u in list(self._gathered):
            self.free(u)
        self._done.clear()
        self._calls = [0] * len(self.units)
        self._root_depth = 0  # (a forward that raised never reached its post-forward hook)
        return rest
