"""``ShardedDataParallel``: our ZeRO stages 1, 2 and 3 around a module, composed of parts.

- a ``GradientReducer`` (``reducer.py``), every stage: gradients averaged across ranks bucket
  by bucket, each rank keeping its own chunk's. Stage 1 keeps the full gradient buffers (as DDP
  keeps its buckets), stages 2 and 3 only the reduced chunks;
- a ``UnitGatherer`` (``gatherer.py``), stage 3 only: parameters sharded too, each unit gathered
  just before its forward and again before its backward, and freed after each. Frozen
  parameters (``requires_grad=False``, read when the module is wrapped) are sharded and
  gathered with their unit as well; they take no gradient, no reduction and no optimizer
  state. Stages 1 and 2 keep every parameter whole, frozen ones included.

The wrapper wires them to the autograd engine and to the ``ShardedOptimizer`` that packed the
module's parameters into flat buckets (``optimizer.attach``: the reducer becomes the optimizer's
gradient source).

Stages 1 and 2: as each parameter's gradient is accumulated, a hook adds it into its bucket's
buffer and drops ``param.grad`` at once; a complete bucket is reduced asynchronously, overlapping
the rest of backward. Buckets are launched strictly in bucket order on every rank (a complete
bucket waits for earlier ones), so the collectives match across ranks even when ranks produce
gradients in different orders or leave different parameters unused.

Stage 3: a unit's gradients stay where autograd put them until the unit's backward is over (its
inputs' gradients are computed, ``gatherer.py``); then they are added into the unit's buffers and
reduced while the next unit's backward runs. That moment follows the order units run in, the
same on every rank, never which parameters received gradients, so reductions and the
backward's all-gathers are issued in the same order everywhere. At most two units' full
gradients exist at once: the one reducing and the one being computed.

At the end of backward (an autograd engine callback) every bucket not yet launched is launched
(zeros for parameters without a gradient), in bucket or unit order; a gradient that came after
its unit was reduced (a parameter used outside its unit's forward) is reduced then too; and one
small all-reduce of "received a gradient" flags tells which parameters no rank used: those get
no gradient at all, so the optimizer skips them exactly as a single process (or DDP with
``find_unused_parameters=True``) would. A parameter without a gradient is never an error. Where
stage 2 all-reduces its buckets (gloo below 4 ranks), the flags ride in the last bucket's
all-reduce instead, and that bucket is launched at the end of backward: one gloo round trip
less per step (``GradientReducer.folds_flags``).

Nothing here keeps the process group alive (see ``groups.py``): the default
group is never held, hooks and the optimizer reach the parts through weak references (dropping
the wrapper frees it), every reduction is waited before backward ends, and ``close()`` waits for
any a failed backward left in flight and removes the hooks.

Gradient accumulation works two ways: backward passes without ``zero_grad`` in between add into
the reduced chunks (reduced every pass), or ``with model.no_sync():`` keeps full local gradients,
DDP-style, and the next synchronised backward reduces their sum.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardbench.strategies.sharded.broadcast import broadcast_coalesced
from shardbench.strategies.sharded.gatherer import UnitGatherer
from shardbench.strategies.sharded.groups import check_shard_size, global_rank, held_weakly, shard_groups
from shardbench.strategies.sharded.optimizer import ShardedOptimizer
from shardbench.strategies.sharded.profiling import profiled
from shardbench.strategies.sharded.reads import StageThreeReads
from shardbench.strategies.sharded.reducer import GradientReducer, default_collective
from shardbench.strategies.sharded.stages import STAGE_PLANS, stage_plan
from shardbench.strategies.sharded.units import UnitPolicy, find_units
from shardbench.strategies.sharded.weak import weakly

#: the stages ``stage=`` takes
STAGES = tuple(STAGE_PLANS)
_UNSET: Any = object()  # stage-3 options not given


class ShardedDataParallel(nn.Module):
    """Our ZeRO stage ``stage`` (1, 2 or 3) around ``module``, with the ``ShardedOptimizer``
    that packed ``module``'s parameters; see the module docstring.

    Stage 3 options: ``unit``, which modules are gathered together (``units.py``; default:
    every parameterised child of an ``nn.ModuleList``/``nn.Sequential``, and the root for the
    rest), and ``prefetch`` (start gathering the next unit while one runs; default on).
    ``gradient_collective``: "reduce_scatter", "all_reduce" or "reduce" (default: ``default_collective``
    of the group's backend).

    ``shard_group_size`` S (hybrid sharding; default: the whole world): shard within groups of
    S consecutive ranks and replicate across the N/S groups. Gradients are reduced within the
    shard group, then each reduced chunk is all-reduced across the ranks holding the same chunk
    in the other groups; stage 3 gathers within the shard group only. S = 1 is DDP with a
    replicated optimizer. Needs the optimizer over the default group."""

    def __init__(
        self,
        module: nn.Module,
        sharded_optimizer: ShardedOptimizer,
        *,
        stage: int = 2,
        unit: UnitPolicy | None = _UNSET,
        prefetch: bool = _UNSET,
        broadcast_buffers: bool = True,
        gradient_collective: str | None = None,
        shard_group_size: int | None = None,
    ) -> None:
        plan = stage_plan(stage)
        opt = sharded_optimizer
        self._check_arguments(opt, stage, plan.parameters, shard_group_size, unit=unit, prefetch=prefetch)
        super().__init__()
        self.module = module
        self.optimizer = opt
        self.stage = stage
        #: what this stage shards: every part below reads it, never the stage number
        self.plan = plan
        #: names the profiler labels (``shardbench::<label>::reduce``)
        self.label = plan.label
        self.broadcast_buffers = broadcast_buffers
        self._set_up_groups(shard_group_size)
        self._unit_policy = None if unit is _UNSET else unit
        self._prefetch = True if prefetch is _UNSET else prefetch
        self._collective = gradient_collective or default_collective(
            dist.get_backend(self.process_group), self.shard_size
        )
        self._sync = True
        self._callback_queued = False
        #: the optimizer's step count at the last synchronised backward: gradients held since
        #: then and not stepped are being accumulated
        self._backward_at_step = -1
        self._start_identical()  # while the parameters are still whole on every rank
        units = self._find_units() if plan.parameters else None
        if units is not None:
            opt.shard_parameters([u.params for u in units])
        self._build(units)
        self._reads = StageThreeReads(self) if plan.parameters else None

    @staticmethod
    def _check_arguments(
        opt: ShardedOptimizer,
        stage: int,
        shards_parameters: bool,
        shard_group_size: int | None,
        *,
        unit: UnitPolicy | None,
        prefetch: bool,
    ) -> None:
        """ValueError for a shard group size that does not divide the world or comes with an
        optimizer over a group of its own, and for stage 3 options given to a stage that does
        not shard parameters; before anything is built, so a refused wrapper changes nothing."""
        if shard_group_size is not None:
            check_shard_size(shard_group_size, opt.world_size)
            if opt.process_group is not None:
                raise ValueError(
                    "shard_group_size needs the ShardedOptimizer over the default group (it makes "
                    "the shard and replica groups from it); drop process_group= or shard_group_size="
                )
        given = sorted(name for name, v in (("unit", unit), ("prefetch", prefetch)) if v is not _UNSET)
        if not shards_parameters and given:
            raise ValueError(
                f"{', '.join(given)}: stage 3 options (stage {stage} does not shard parameters); pass stage=3"
            )

    def _set_up_groups(self, shard_group_size: int | None) -> None:
        """The groups this rank trains in: every data-parallel rank, and with hybrid sharding
        (``shard_group_size`` below the world) the shard group the optimizer is narrowed to and
        the replica group across the shard groups."""
        opt = self.optimizer
        #: the ranks that train this module data-parallel (held as the optimizer held it), and
        #: how many of them: broadcasts and the used-gradient agreement run over all of them
        self._data_group = held_weakly(opt.process_group)
        self.world_size = opt.world_size
        self._src = global_rank(self.data_group, 0)
        #: hybrid sharding: this rank's replica group (the ranks holding the same chunks), held
        #: weakly; None where the shard group is the whole world
        self._replicate_group = None
        self.replicas = 1
        if shard_group_size is not None and shard_group_size != opt.world_size:
            shard, replicate = shard_groups(shard_group_size)
            opt.shard_within(shard)
            self._replicate_group = held_weakly(replicate)
            self.replicas = self.world_size // shard_group_size
        #: ranks each chunk is sharded over (S; N without hybrid sharding)
        self.shard_size = opt.world_size

    @property
    def process_group(self) -> dist.ProcessGroup | None:
        """The group parameters are sharded over (the optimizer's; None: the default group)."""
        return self.optimizer.process_group

    @property
    def data_group(self) -> dist.ProcessGroup | None:
        """Every rank that trains this module (None: the default group)."""
        return self._data_group()

    @property
    def replicate_group(self) -> dist.ProcessGroup | None:
        """Hybrid sharding: the ranks holding this rank's chunks in the other shard groups."""
        return None if self._replicate_group is None else self._replicate_group()

    def _find_units(self) -> list[Any]:
        """Stage 3's units over the optimizer's trainable parameters (the buckets'), and the
        module's frozen parameters, sharded with them."""
        return find_units(
            self.module,
            self._unit_policy,
            [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad],
            frozen=[p for p in self.module.parameters() if not p.requires_grad],
        )

    def _build(self, units: list[Any] | None) -> None:
        """The parts over the optimizer's current buckets: the reducer, and the gatherer (stage 3)
        or the gradient hooks (stages 1-2)."""
        opt = self.optimizer
        self.reducer = GradientReducer(
            opt.buckets,
            world_size=self.shard_size,
            process_group=self.process_group,
            replicas=self.replicas,
            replicate_group=self._replicate_group,
            agree_group=self._data_group,
            keep=self.plan.keep,
            collective=self._collective,
            max_in_flight=self.plan.max_in_flight,
            label=self.label,
            fold_flags=self.plan.folds_flags,
        )
        opt.attach(self.reducer)
        self.gatherer: UnitGatherer | None = None
        self._hook_handles: list[Any] = []
        if units is not None:
            self.gatherer = UnitGatherer(
                units,
                opt,
                prefetch=self._prefetch,
                backward_started=weakly(self._queue_finish),
                unit_backward_done=weakly(self._unit_backward_done),
            )
        else:
            self._hook_handles = [
                p.register_post_accumulate_grad_hook(weakly(self._on_grad, b.index, i))
                for b in opt.buckets
                for i, p in enumerate(b.params)
            ]
        self._pending = [len(b.params) for b in opt.buckets]  # stages 1-2: gradients still to come
        self._ready: set[int] = set()  # complete buckets, not launched yet
        self._next = 0  # the next bucket to launch, in bucket order
        self._module_params = list(self.module.parameters())
        self._layout = self._layout_key()

    # ----- trainability and param groups changing between steps -------------------------------
    def _layout_key(self) -> tuple[Any, ...]:
        return (self.optimizer.layout_key(), tuple(p.requires_grad for p in self._module_params))

    def _relayout_if_changed(self) -> None:
        """Once per forward: if a ``requires_grad`` flipped or a param group was added since the
        buckets were laid out, lay them out again before this forward, as a DDP built now would
        be: a newly trainable parameter is reduced and stepped from this step on, a newly frozen
        one gets no gradient, its gradient shard goes and its optimizer state leaves the step
        (parked, 1/N per rank, so unfreezing it again resumes it as a plain optimizer would),
        and every other parameter keeps its state. A collective (every rank changed the same
        parameters); stage 3 holds the module whole on each rank while it re-cuts the shards."""
        if self._layout_key() == self._layout:
            return
        held = [p for p in self._module_params if p.grad is not None]
        if held or (self.reducer.holds_gradients() and self._backward_at_step == self.optimizer.steps_taken):
            raise RuntimeError(
                "ShardedDataParallel: requires_grad or the optimizer's param groups changed while "
                "gradients are being accumulated (a backward since the last optimizer step); change "
                "them between steps, after optimizer.step()"
            )
        with profiled(f"shardbench::{self.label}::relayout"):
            self._take_apart()
            if self.gatherer is not None:
                self.gatherer.unshard()
            units = self._find_units() if self.plan.parameters else None
            self.optimizer.relayout(None if units is None else [u.params for u in units])
            self._build(units)

    def _take_apart(self) -> None:
        """Wait for any reduction, remove the gradient hooks and detach from the optimizer."""
        self.reducer.drain()
        self._callback_queued = False
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles.clear()
        self.optimizer.detach(self.reducer)

    def _start_identical(self) -> None:
        """Start from identical weights, as DDP does: rank 0's, broadcast. The flat buckets hold
        the optimizer's trainable parameters; everything else the module holds (frozen
        parameters, parameters no optimizer group lists, buffers) travels coalesced, one
        collective per device: a rank that initialised its own frozen embedding would
        otherwise train a different model from the others, with no error."""
        if self.world_size > 1:
            with torch.no_grad():
                for flat in self.optimizer.flats:
                    dist.broadcast(flat, src=self._src, group=self.data_group)
                in_flats = {id(p) for b in self.optimizer.buckets for p in b.params}
                rest = [p for p in self.module.parameters() if id(p) not in in_flats]
                broadcast_coalesced([*rest, *self.module.buffers()], src=self._src, group=self.data_group)
            self.optimizer.refresh_master_weights()  # (16-bit parameters: masters of rank 0's values)

    def close(self) -> None:
        """End of training, before ``dist.destroy_process_group``: wait for any reduction still
        in flight (a backward that raised leaves its launched buckets so), remove the hooks and
        detach from the optimizer. The wrapper reduces nothing afterwards."""
        self._take_apart()
        if self.gatherer is not None:
            self.gatherer.close()
        if self._reads is not None:
            self._reads.close()

    # ----- what the caller sees ----------------------------------------------------------------
    @property
    def memory_observer(self) -> Callable[[torch.Tensor, str], None] | None:
        """Memory accounting observer: called with each tensor allocated for the reduction and
        its category ("grads" for the gradients a rank keeps, "comm" for buffers in flight)."""
        return self.reducer.memory_observer

    @memory_observer.setter
    def memory_observer(self, observer: Callable[[torch.Tensor, str], None] | None) -> None:
        self.reducer.memory_observer = observer

    @property
    def units(self) -> list[Any]:
        """Stage 3's units (``units.Unit``), root first; empty below stage 3."""
        return self.gatherer.units if self.gatherer is not None else []

    def gathered_units(self) -> list[str]:
        """Names of the units whose full parameters exist now ("" is the root); below stage 3
        parameters are never sharded, so there are none to name."""
        return self.gatherer.gathered_units() if self.gatherer is not None else []

    def idle(self) -> bool:
        """Nothing of a backward pass is left: no gradient held for a reduction, no bucket
        buffer, no reduction in flight (true between steps)."""
        held = any(p.grad is not None for b in self.optimizer.buckets for p in b.params)
        return self.reducer.idle() and not (self._sync and held)

    def memory_tensors(self) -> dict[str, list[torch.Tensor]]:
        """Tensors held now, by category: the gradients a rank keeps, and (stage 3) its
        parameter chunks, trainable and frozen ("params": the parameters it keeps; gathered flat
        buffers are the module's parameters' storage, which the memory tracker already counts as
        parameters)."""
        tensors = self.reducer.memory_tensors()
        if self.gatherer is not None:
            tensors["params"] = [*self.optimizer.chunks, *self.gatherer.frozen.chunks]
        return tensors

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The module's state dict with whole parameters, on every rank (a collective under stage
        3: call it on every rank; units are gathered one at a time, so beside the result a rank
        holds at most one unit's full parameters)."""
        if self.gatherer is None or self._reads is None:
            return self.module.state_dict()
        with self._reads.values_whole():  # (the parameters themselves: their values come below)
            state = self.module.state_dict(keep_vars=True)
        for name, value in state.items():
            if not isinstance(value, nn.Parameter):
                state[name] = value.detach()
        names: dict[int, list[str]] = {}
        for name, p in self.module.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(name)
        gathered = set(self.gatherer.gathered_units())
        for u in self.gatherer.units:
            self.gatherer.gather(u.index)
            for p in (*u.params, *u.frozen):
                value = p.detach().clone()
                for name in names.get(id(p), []):
                    state[name] = value
            if u.name not in gathered:
                self.gatherer.free(u.index)
        return state

    def state_dict(
        self, *args: Any, destination: Any = None, prefix: str = "", keep_vars: bool = False
    ) -> Any:
        """As ``nn.Module.state_dict`` (keys under ``module.``); at stage 3 the values are whole,
        gathered unit by unit (``full_state_dict``): a collective, call it on every rank."""
        if self._reads is None or self._reads.whole:
            return super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        out: Any = destination if destination is not None else OrderedDict()
        for key, value in self.full_state_dict().items():
            out[f"{prefix}module.{key}"] = value
        return out

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """As ``nn.Module.load_state_dict`` (keys under ``module.``); at stage 3 the whole values
        are loaded into every unit gathered, and each rank keeps its shards of them: a
        collective, call it on every rank."""
        with self.summon_full_params():
            result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self.optimizer.refresh_master_weights()
        return result

    @contextlib.contextmanager
    def summon_full_params(self) -> Iterator[None]:
        """Every parameter whole for the block (stage 3 gathers every unit; stages 1-2 keep them
        whole anyway), as FSDP's context of that name: a collective, every rank enters it, and
        each rank then holds the whole model's parameters. What the block writes into them
        (loaded or averaged weights) is kept when it ends; nothing is freed inside it, forward
        passes included."""
        if self.gatherer is None or self._reads is None:
            yield
            return
        with self.gatherer.pinned(), self._reads.values_whole():
            yield

    def module_hooks(self) -> list[Callable[..., Any]]:
        """The hooks this wrapper put on the module's submodules."""
        return list(self.gatherer.hook_fns) if self.gatherer is not None else []

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        raise RuntimeError(
            "copy.deepcopy(ShardedDataParallel): the wrapper holds process-group state and cannot be "
            "copied; copy the wrapped module (`wrapper.module`; at stage 3 inside "
            "`with wrapper.summon_full_params():`, a collective)"
        )

    # ----- forward -----------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._relayout_if_changed()
        if self.broadcast_buffers and self.world_size > 1:
            self._broadcast_buffers()
        return self.module(*args, **kwargs)

    def _broadcast_buffers(self) -> None:
        """Rank 0's buffers (norm statistics) to every rank, as DDP does before each forward: one
        broadcast per device, not one per buffer nor per dtype (``broadcast.py``)."""
        broadcast_coalesced(self.module.buffers(), src=self._src, group=self.data_group)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate full local gradients without communication (DDP semantics)."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    # ----- backward ----------------------------------------------------------------------------
    def _queue_finish(self) -> None:
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(weakly(self._finish_backward))
            self._callback_queued = True

    def _on_grad(self, index: int, i: int, p: torch.Tensor) -> None:
        """Stages 1-2: post-accumulate-grad hook of parameter ``i`` of bucket ``index``."""
        grad = p.grad
        if grad is None or not self._sync:  # under no_sync the gradient stays in p.grad
            return
        self._queue_finish()
        self.reducer.add(self.optimizer.buckets[index], i, grad)
        # The full gradient now lives in the bucket buffer only; dropped before a launch
        # allocates the reduction's output, so the two never coexist.
        del grad
        p.grad = None
        self._pending[index] -= 1
        if self._pending[index] == 0:
            self._ready.add(index)
            self._launch_in_order()

    def _launch_in_order(self, *, final: bool = False) -> None:
        """Launch the complete buckets that are next in order; the one carrying the used-gradient
        flags (``GradientReducer.folds_flags``) only when backward is over (``final``)."""
        buckets = self.optimizer.buckets
        end = len(buckets) if final or not self.reducer.folds_flags else self.reducer.fold_bucket
        while self._next < end and self._next in self._ready:
            self.reducer.launch(buckets[self._next])
            self._next += 1

    def _unit_backward_done(self, u: int) -> None:
        """Stage 3: unit ``u``'s backward is over (and it is freed): reduce its gradients."""
        if self._sync:
            self._reduce_unit(u)

    def _reduce_unit(self, u: int) -> None:
        assert self.gatherer is not None
        own = self.gatherer.unit_buckets[u]
        if not own:  # all frozen: nothing to reduce, and the reduction in flight may go on
            return
        # The previous unit's reduction completes first: its buffer goes before this one's comes.
        self.reducer.drain()
        buckets = self.optimizer.buckets
        for bi in own:
            self._reduce_bucket_now(buckets[bi])

    def _reduce_bucket_now(self, bucket: Any) -> None:
        """Add every gradient ``bucket``'s parameters hold (autograd's, and any a ``no_sync``
        pass left) into its buffer, drop them, and launch its reduction."""
        self.reducer.add_all(bucket, [p.grad for p in bucket.params])
        for p in bucket.params:
            p.grad = None
        self.reducer.launch(bucket)

    def _finish_backward(self) -> None:
        """End of backward: launch what is left, in an order every rank shares, then agree on
        which parameters received gradients."""
        self._callback_queued = False
        with profiled(f"shardbench::{self.label}::reduce"):
            if self.gatherer is not None:
                self._finish_units()
            elif self._sync:
                for b in self.optimizer.buckets[self._next :]:
                    self._collect_leftovers(b)
                    self._ready.add(b.index)
                self._launch_in_order(final=True)
                agreement = self.reducer.start_agreeing()
                self.reducer.drain()
                self.reducer.agreed(agreement)
        if self._sync:
            self._backward_at_step = self.optimizer.steps_taken
        self._pending = [len(b.params) for b in self.optimizer.buckets]
        self._ready.clear()
        self._next = 0

    def _collect_leftovers(self, bucket: Any) -> None:
        """Gradients a ``no_sync`` pass left in ``p.grad`` for parameters this synchronised pass
        did not use (no hook collected them): they belong in the sum too."""
        for i, p in enumerate(bucket.params):
            if p.grad is not None:
                self.reducer.add(bucket, i, p.grad)
                p.grad = None

    def _finish_units(self) -> None:
        assert self.gatherer is not None
        rest = self.gatherer.finish_backward()  # frees every unit still gathered
        if not self._sync:  # nothing is reduced: the gradients wait, whole, for a synchronised pass
            return
        for u in rest:
            self._reduce_unit(u)
        # A gradient that arrived after its unit was reduced: reduced now, in bucket order, on
        # every rank that agrees one exists anywhere (flags in the used-gradient all-reduce).
        buckets = self.optimizer.buckets
        late = [int(any(p.grad is not None for p in b.params)) for b in buckets]
        agreement = self.reducer.start_agreeing(late)
        self.reducer.drain()  # (before the late gradients fill buffers of their own)
        for b, flag in zip(buckets, late, strict=True):
            if flag:
                self.reducer.add_all(b, [p.grad for p in b.params])
                for p in b.params:
                    p.grad = None
        for b, flag in zip(buckets, self.reducer.agreed(agreement), strict=True):
            if flag:
                self.reducer.launch(b)
        self.reducer.drain()
