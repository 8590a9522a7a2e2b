"""``ShardedOptimizer``: ZeRO stage 1, optimizer state sharded across ranks.

Wraps any elementwise ``torch.optim`` class. Trainable parameters are moved into flat buckets
(see ``layout.py``) and each rank builds the wrapped optimizer over only the pieces of each
bucket it owns, so it keeps optimizer state for ~1/N of the elements. A step then reads in three
phases, each labelled for the profiler:

1. ``grads``: point each owned piece's ``.grad`` at its slice of the full gradient (stage 1:
   ``param.grad`` as DDP left it) or of the reduced gradient shard (stage 2 attaches a source);
2. ``step``: the wrapped optimizer updates the owned pieces in place (views of the parameters,
   or of fp32 master copies when the parameters are low precision);
3. ``gather``: ``all_gather_into_tensor`` per bucket brings every rank the updated parameters
   (stages 1-2; stage 3 keeps only its chunks and gathers a unit's parameters when it runs).

Only optimizers whose update is elementwise give results identical to the unsharded optimizer
when run on slices; others (LARS, LAMB, Adafactor: per-tensor norms or factored statistics) are
refused unless the caller vouches for them with ``assume_elementwise=True``.

The contract with a wrapper that reduces gradients (``ShardedDataParallel``) is two calls:
``attach(source)``, after which the step reads each bucket's reduced gradient chunk from the
source (a ``GradientSource``) instead of ``param.grad``, and, for stage 3 only and before
``attach``, ``shard_parameters(units)``, after which the optimizer keeps only its chunks and the
wrapper gathers parameters when they are used. The optimizer knows nothing else of the wrapper.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist

# Imported before any process group exists, on purpose: its functions take ``group=group.WORLD``
# as a default argument, evaluated at import. Imported later (torch.optim imports it lazily, via
# torch._dynamo, when the first optimizer is built) it would capture the live default group and
# keep it alive past ``destroy_process_group``: see ``groups.py`` for why that kills.
import torch.distributed.nn  # noqa: F401
from torch import nn

from shardbench.strategies.sharded.checkpoint import (
    assemble_full_state,
    hyperparameters,
    slice_state,
    state_pieces,
)
from shardbench.strategies.sharded.groups import global_rank, held_weakly
from shardbench.strategies.sharded.layout import (
    BUCKET_CAP_MB,
    FIRST_BUCKET_BYTES,
    Bucket,
    build_buckets,
    flatten_into_buckets,
    whole_shape,
)
from shardbench.strategies.sharded.parameter_sync import GatherAfterStep, GatheredByUnits, ParameterSync
from shardbench.strategies.sharded.profiling import profiled

#: optimizers whose update of each element depends only on that element's gradient and state.
ELEMENTWISE_OPTIMIZERS: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.SGD,
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.RMSprop,
    torch.optim.Adagrad,
    torch.optim.Adamax,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.Adadelta,
    torch.optim.Rprop,
)


#: the state entry under which ``carry_state`` moves a shard's fp32 master weights
MASTER_KEY = "shardbench.master"


def check_elementwise(optim: type, assume_elementwise: bool) -> None:
    if assume_elementwise or (isinstance(optim, type) and issubclass(optim, ELEMENTWISE_OPTIMIZERS)):
        return
    allowed = ", ".join(c.__name__ for c in ELEMENTWISE_OPTIMIZERS)
    raise ValueError(
        f"ShardedOptimizer cannot shard {getattr(optim, '__name__', optim)!r} exactly: its update may "
        f"need whole-tensor statistics (like LARS/LAMB trust ratios). Allowed: {allowed}; pass "
        "assume_elementwise=True only if every element's update depends on that element alone"
    )


class GradientSource(Protocol):
    """Where a ``ShardedOptimizer`` reads its gradients once a wrapper reduces them for it."""

    #: names the optimizer's profiler labels (``shardbench::<label>::step``)
    label: str

    def gradient_chunk(self, bucket: int) -> torch.Tensor | None:
        """This rank's reduced gradient for its chunk of bucket ``bucket`` (flat, the chunk's
        length), or None when there is none since ``zero_grad``."""

    def received_gradient(self, bucket: int, param: int) -> bool:
        """Whether parameter ``param`` of bucket ``bucket`` received a gradient on any rank
        (one that did not is skipped by the step, as a single process would skip it)."""

    def on_zero_grad(self, set_to_none: bool) -> None:
        """The optimizer's ``zero_grad`` was called."""


SOURCE_GONE = (
    "the ShardedDataParallel that holds this optimizer's gradients is gone: keep a reference to it "
    "for as long as you train"
)


class ShardedOptimizer(torch.optim.Optimizer):
    """Optimizer state sharding (ZeRO-1), balanced to the element; see the module docstring.

    ``param_groups`` are the user-facing groups over the full parameters (LR schedulers work on
    them); hyperparameters are copied to the wrapped optimizer's groups before every step.
    ``state`` is the wrapped optimizer's state, keyed by this rank's shard tensors.
    """

    def __init__(
        self,
        params: Iterable[Any],
        optim: type[torch.optim.Optimizer] = torch.optim.AdamW,
        *,
        process_group: dist.ProcessGroup | None = None,
        bucket_cap_mb: float = BUCKET_CAP_MB,
        assume_elementwise: bool = False,
        **optim_kwargs: Any,
    ) -> None:
        check_elementwise(optim, assume_elementwise)
        if not dist.is_initialized():
            raise RuntimeError("ShardedOptimizer needs torch.distributed initialised (a process group)")
        self._optim_cls = optim
        self._optim_kwargs = optim_kwargs
        self._group = held_weakly(process_group)
        self.world_size = dist.get_world_size(self.process_group)
        self.rank = dist.get_rank(self.process_group)
        self._cap_bytes = max(1, int(bucket_cap_mb * 2**20))
        self.buckets: list[Bucket] = []
        self.flats: list[torch.Tensor] = []  # the parameters live in these (one per bucket)
        #: this rank's chunk of each bucket: a view of its flat buffer, or (after
        #: ``shard_parameters``) a tensor of its own that outlives the flat buffer's storage
        self.chunks: list[torch.Tensor] = []
        #: how the updated chunks reach every rank: all-gathered after each step, or (after
        #: ``shard_parameters``) kept as this rank's only copy, for a wrapper to gather by unit
        self.parameter_sync: ParameterSync = GatherAfterStep(self.process_group, self.world_size)
        self._masters: list[torch.Tensor | None] = []  # fp32 own chunk for low-precision params
        self._shards: list[list[nn.Parameter]] = []  # per bucket: one tensor per owned piece
        self._bucket_group: list[int] = []
        self.local: torch.optim.Optimizer | None = None
        #: names the profiler labels; the attached gradient source's label once there is one
        self.label = "zero1"
        #: the attached ``GradientSource``, held weakly (``attach``); None: ``param.grad``
        self._source: weakref.ref[GradientSource] | None = None
        self._grads_ready = False
        self._consolidated: dict[str, Any] | None = None
        self._stateful = False  # stepped or loaded a state dict: the layout is now fixed
        #: the optimizer state of parameters in a group that are frozen now (``requires_grad``
        #: False): out of the step and the buckets, kept as this rank's even slice (1/N) so that
        #: unfreezing resumes it as a plain optimizer would. id(param) -> (param, lo, hi, state)
        self._parked: dict[int, tuple[nn.Parameter, int, int, dict[str, Any]]] = {}
        #: steps taken (a wrapper tells from it whether gradients it holds were stepped)
        self.steps_taken = 0
        #: the inverse loss scale still owed by 16-bit gradients, applied as each is converted
        #: to fp32 for the step (``unscale_grads_``): none are copied early just to unscale them
        self._owed_unscale: torch.Tensor | None = None
        self._ready = False
        super().__init__(params, optim_kwargs)
        self._ready = True
        self._shard_groups(list(range(len(self.param_groups))))
        self._layout = self.layout_key()

    @property
    def process_group(self) -> dist.ProcessGroup | None:
        """The group the chunks are sharded over and collectives run on: None for the default
        group, looked up at each call; any other only weakly held (``groups.py``)."""
        return self._group()

    def shard_within(self, group: dist.ProcessGroup) -> None:
        """Hybrid sharding: re-pack the buckets into chunks over ``group`` (this rank's shard
        group, a part of the world), before anything relies on the current ones. Only an
        optimizer without state, not yet attached to a wrapper, can be re-packed."""
        self._check_repackable()
        self._group = held_weakly(group)
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._repack(None)

    def _repack(self, unit_of: dict[int, int] | None) -> None:
        """Lay every group's trainable parameters out anew over the current group: buckets by
        the size cap, or (``unit_of``: parameter id -> unit, stage 3) one set per unit, whose
        chunks are then this rank's only copy and whose step gathers nothing."""
        self.buckets, self.flats, self.chunks, self._masters, self._shards = [], [], [], [], []
        self._bucket_group = []
        self.local = None
        self.parameter_sync = (
            GatheredByUnits() if unit_of is not None else GatherAfterStep(self.process_group, self.world_size)
        )
        self._shard_groups(list(range(len(self.param_groups))), unit_of=unit_of)

    def _check_repackable(self) -> None:
        if self._source is not None:
            raise RuntimeError("cannot re-pack the buckets: ShardedDataParallel already relies on them")
        if self._stateful:
            raise RuntimeError(
                "cannot re-pack the buckets of an optimizer that has state (it has stepped or "
                "loaded a state dict): wrap the model before the first step, load state after"
            )

    def shard_parameters(self, units: Sequence[Sequence[nn.Parameter]]) -> None:
        """Stage 3: re-pack the buckets one per unit (and param group) and keep only this rank's
        chunk of each, as a tensor of its own; the flat buffers are left without storage (their
        metadata kept: the parameters stay views of them) for the wrapper to gather a unit's
        when it runs. A unit is gathered with one collective per bucket, so buckets follow unit
        boundaries, whatever their size (more than one only where a unit's parameters differ in
        dtype or device). The step then updates the chunks and gathers nothing.

        ``units`` lists, per unit, its parameters; every trainable parameter of every group must
        be in exactly one unit. Only an optimizer without state (it has not stepped or loaded a
        state dict: its state is keyed by the shards this replaces) and not yet attached to a
        wrapper can be re-packed."""
        self._check_repackable()
        trainable = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        unit_of: dict[int, int] = {}
        for u, params in enumerate(units):
            for p in params:
                if id(p) in unit_of:
                    raise ValueError(f"a parameter of shape {tuple(p.shape)} is in two units")
                unit_of[id(p)] = u
        missing = [p for p in trainable if id(p) not in unit_of]
        if missing or len(unit_of) != len(trainable):
            raise ValueError(
                f"units must cover exactly the optimizer's trainable parameters: {len(missing)} of "
                f"{len(trainable)} are in no unit, {len(unit_of) - len(trainable) + len(missing)} "
                "unit parameters are not trainable parameters of this optimizer"
            )
        self._repack(unit_of)

    def attach(self, source: GradientSource) -> None:
        """From now on the step reads its gradients from ``source`` (held weakly: the wrapper
        that owns it decides its lifetime), and ``zero_grad`` tells it; the bucket layout is
        then fixed (the source's hooks follow it)."""
        if self._source is not None and self._source() is not None:
            raise RuntimeError("this ShardedOptimizer already has a ShardedDataParallel: wrap a model once")
        self._source = weakref.ref(source)
        self.label = source.label

    def detach(self, source: GradientSource) -> None:
        """``source`` no longer provides gradients (its wrapper closed)."""
        if self._source is not None and self._source() is source:
            self._source = None

    def _attached(self) -> GradientSource | None:
        if self._source is None:
            return None
        source = self._source()
        if source is None:
            raise RuntimeError(SOURCE_GONE)
        return source

    @classmethod
    def from_optimizer(cls, template: torch.optim.Optimizer, **kwargs: Any) -> ShardedOptimizer:
        """Shard an already-built (still stateless) optimizer: same class, groups, hyperparameters,
        and its defaults, which a group added later (``add_param_group``) is completed from."""
        groups = [dict(g) for g in template.param_groups]
        sharded = cls(groups, optim=type(template), **kwargs)
        sharded._template_defaults = dict(template.defaults)
        sharded.defaults = {**sharded.defaults, **sharded._template_defaults}
        return sharded

    # ----- building the shards ---------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group, as on any optimizer (a fine-tuning callback adds the backbone it
        unfreezes). Unattached, its trainable parameters become shards at once; once a
        ``ShardedDataParallel`` relies on the buckets, the group is laid out, with buckets (and
        stage 3 units) of its own, at the wrapper's next forward (``relayout``)."""
        super().add_param_group(param_group)
        if self._ready and self._source is None:
            self._shard_groups([len(self.param_groups) - 1])
            self._layout = self.layout_key()

    # ----- changing the layout between steps ---------------------------------------------------
    def layout_key(self) -> tuple[Any, ...]:
        """What the buckets were built from: the groups and which of their parameters train. A
        change of either (a ``requires_grad`` flipped, a group added) calls for ``relayout``."""
        trains = tuple(p.requires_grad for g in self.param_groups for p in g["params"])
        return (len(self.param_groups), trains)

    def layout_stale(self) -> bool:
        return self._layout != self.layout_key()

    def carry_state(self) -> dict[int, dict[str, Any]]:
        """Every parameter's whole optimizer state (and fp32 master weights), on every rank: what
        ``relayout`` cuts again for the new layout. A collective; each rank briefly holds the
        optimizer's whole state, on the CPU."""
        payload = state_pieces(self._owned_state(masters=True))
        gathered: list[Any] = [None] * self.world_size
        if self.world_size > 1:
            dist.all_gather_object(gathered, payload, group=self.process_group)
        else:
            gathered = [payload]
        return assemble_full_state(self.param_groups, gathered)["state"]

    def relayout(self, units: Sequence[Sequence[nn.Parameter]] | None = None) -> None:
        """Re-pack every group's trainable parameters (each whole, in its own storage or a
        bucket's) into new buckets, one set per unit where ``units`` is given (stage 3), and
        give each new piece its part of the state carried over (``carry_state``, a collective,
        taken before the parameters move): every parameter that trained before and trains now keeps its state,
        a newly trainable one starts as a plain optimizer would start it, and a newly frozen
        one leaves the step, its state parked. Only a wrapper that detached from this optimizer
        calls it (``ShardedDataParallel``), or ``step`` when none is attached."""
        carried = self.carry_state()
        training = {id(p) for g in self.param_groups for p in g["params"] if p.requires_grad}
        with torch.no_grad():
            for b in self.buckets:  # a parameter that leaves the buckets must not pin its old buffer
                for p in b.params:
                    if id(p) not in training and p.untyped_storage().size():
                        p.data = p.detach().clone()
        self._parked = {}
        self._grads_ready = False
        self._consolidated = None
        unit_of = None
        if units is not None:
            unit_of = {id(p): u for u, params in enumerate(units) for p in params}
        self._repack(unit_of)
        self._place_state(carried)
        self._layout = self.layout_key()

    def _owned_state(self, *, masters: bool = False) -> list[tuple[int, int, int, dict[str, Any] | None]]:
        """(parameter index, lo, hi, state) of every piece this rank keeps state for: its shards,
        and the parked slices of frozen parameters; with ``masters``, each shard's fp32 master
        weights ride along as the state entry ``MASTER_KEY``."""
        assert self.local is not None
        index = self._param_index()
        owned: list[tuple[int, int, int, dict[str, Any] | None]] = []
        for b, shards, master in zip(self.buckets, self._shards, self._masters, strict=True):
            for pc, shard in zip(b.pieces, shards, strict=True):
                st = self.local.state.get(shard)
                if masters and master is not None:
                    st = {**(st or {}), MASTER_KEY: master[pc.chunk_offset : pc.chunk_offset + pc.numel]}
                owned.append((index[id(b.params[pc.param_index])], pc.lo, pc.hi, st))
        owned += [(index[i], lo, hi, st) for i, (_, lo, hi, st) in self._parked.items() if i in index]
        return owned

    @torch.no_grad()
    def _place_state(self, full: dict[int, dict[str, Any]]) -> None:
        """Give each shard its slice of ``full`` (plain-format state by parameter index), and
        park the state of parameters that are in a group but frozen."""
        assert self.local is not None
        params = [p for g in self.param_groups for p in g["params"]]
        index = {id(p): i for i, p in enumerate(params)}
        for b, shards, master in zip(self.buckets, self._shards, self._masters, strict=True):
            for pc, shard in zip(b.pieces, shards, strict=True):
                st = full.get(index[id(b.params[pc.param_index])])
                self.local.state.pop(shard, None)
                if st is None:
                    continue
                piece = slice_state(st, pc.lo, pc.hi, shard.device)
                kept = piece.pop(MASTER_KEY, None)
                if kept is not None and master is not None:
                    master[pc.chunk_offset : pc.chunk_offset + pc.numel].copy_(kept)
                if piece:
                    self.local.state[shard] = piece
        self._parked = {}
        laid_out = {id(p) for b in self.buckets for p in b.params}
        for i, p in enumerate(params):
            st = full.get(i)
            if id(p) in laid_out or not st:  # (a trainable one not laid out yet waits here too)
                continue
            numel = whole_shape(p).numel()
            per = -(-numel // self.world_size)
            lo, hi = min(numel, self.rank * per), min(numel, (self.rank + 1) * per)
            st = {k: v for k, v in st.items() if k != MASTER_KEY}
            if st and (lo < hi or self.rank == 0):
                self._parked[id(p)] = (p, lo, hi, slice_state(st, lo, hi, p.device))

    def _group_buckets(self, trainable: list[nn.Parameter], unit_of: dict[int, int] | None) -> list[Bucket]:
        """Buckets of one group's trainable parameters: by the size cap, or one per unit."""
        if unit_of is None:
            elem = trainable[0].element_size() if trainable else 4
            return build_buckets(
                trainable,
                world_size=self.world_size,
                rank=self.rank,
                cap_numel=max(1, self._cap_bytes // elem),
                first_index=len(self.buckets),
                first_cap_numel=max(1, FIRST_BUCKET_BYTES // elem) if not self.buckets else None,
            )
        buckets: list[Bucket] = []
        for u in sorted({unit_of[id(p)] for p in trainable}):
            params = [p for p in trainable if unit_of[id(p)] == u]
            buckets += build_buckets(
                params,
                world_size=self.world_size,
                rank=self.rank,
                cap_numel=sum(p.numel() for p in params),
                first_index=len(self.buckets) + len(buckets),
            )
        return buckets

    def _shard_groups(self, group_indices: list[int], *, unit_of: dict[int, int] | None = None) -> None:
        local_groups = []
        for gi in group_indices:
            group = self.param_groups[gi]
            buckets = self._group_buckets([p for p in group["params"] if p.requires_grad], unit_of)
            group_shards: list[nn.Parameter] = []
            for b in buckets:
                # one bucket at a time: a re-pack then holds the old buffers (released as their
                # parameters move out) and one new one, not a second copy of the model
                (flat,) = flatten_into_buckets([b])
                chunk = flat[b.chunk_start : b.chunk_start + b.chunk]
                # fp32 masters for 16-bit parameters only: a float64 one is its own master
                low_precision = flat.is_floating_point() and flat.element_size() < 4
                sharded = self.parameter_sync.shards_parameters
                if sharded:
                    chunk = chunk.clone()
                master = chunk.detach().float() if low_precision else None
                if sharded:  # the chunk is this rank's copy now; a wrapper gathers
                    flat.untyped_storage().resize_(0)
                src = master if master is not None else chunk
                shards = [nn.Parameter(src[pc.chunk_offset : pc.chunk_offset + pc.numel]) for pc in b.pieces]
                self.buckets.append(b)
                self.flats.append(flat)
                self.chunks.append(chunk)
                self._masters.append(master)
                self._shards.append(shards)
                self._bucket_group.append(gi)
                group_shards.extend(shards)
            local_groups.append({**hyperparameters(group), "params": group_shards})
        if self.local is None:
            self.local = self._optim_cls(local_groups, **self._optim_kwargs)
            self.state = self.local.state  # type: ignore[assignment]
            self.defaults = {**self.local.defaults, **getattr(self, "_template_defaults", {})}
        else:
            for g in local_groups:
                self.local.add_param_group(g)
        # The user-facing groups show every hyperparameter the wrapped optimizer filled in, so
        # schedulers and state dicts see what a plain optimizer would show.
        for gi, local_group in zip(
            group_indices, self.local.param_groups[-len(group_indices) :], strict=True
        ):
            for k, v in hyperparameters(local_group).items():
                self.param_groups[gi].setdefault(k, v)

    # ----- the step ----------------------------------------------------------------------------
    def _grads_from_params(self) -> None:
        """Stage 1: the full gradient is in ``param.grad`` (all-reduced by DDP)."""
        for b, shards in zip(self.buckets, self._shards, strict=True):
            for pc, shard in zip(b.pieces, shards, strict=True):
                grad = b.params[pc.param_index].grad
                shard.grad = None if grad is None else _as(grad.reshape(-1)[pc.lo : pc.hi], shard)

    def _grads_from_source(self, source: GradientSource) -> None:
        """Stages 2-3 (and 1 under ShardedDataParallel): the reduced chunk the source keeps."""
        for b, shards in zip(self.buckets, self._shards, strict=True):
            for shard, g in zip(shards, self._bucket_grads(source, b), strict=True):
                shard.grad = g

    def _bucket_grads(self, source: GradientSource, b: Bucket) -> list[torch.Tensor | None]:
        """Bucket ``b``'s reduced gradient pieces from ``source``, in the shards' dtype (an fp32
        copy of a 16-bit gradient, a view otherwise); None where no rank produced one."""
        chunk = source.gradient_chunk(b.index)
        grads = [
            None
            if chunk is None or not source.received_gradient(b.index, pc.param_index)
            else _as(chunk[pc.chunk_offset : pc.chunk_offset + pc.numel], shard)
            for pc, shard in zip(b.pieces, self._shards[b.index], strict=True)
        ]
        if self._owed_unscale is not None:
            for g in grads:
                if g is not None and g.dtype != chunk.dtype:  # type: ignore[union-attr]
                    g.mul_(self._owed_unscale.to(g.dtype))
        # a converted copy is a gradient, made outside the optimizer's own step: say so to
        # memory accounting (the source's observer), which would otherwise see a temporary
        observe = getattr(source, "memory_observer", None)
        if observe is not None and chunk is not None and self._masters[b.index] is not None:
            for g in grads:
                if g is not None:
                    observe(g, "grads")
        return grads

    def prepare_grads(self) -> None:
        """Point every owned shard's ``.grad`` at its gradient (idempotent within a step)."""
        if not self._grads_ready:
            source = self._attached()
            with profiled(f"shardbench::{self.label}::grads"):
                if source is None:
                    self._grads_from_params()
                else:
                    self._grads_from_source(source)
            self._grads_ready = True

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        assert self.local is not None
        if self.layout_stale() and self._source is None:
            self.relayout()
        # (attached, a change since the forward is laid out at the next forward: this step
        # updates what this backward computed gradients for, as a plain optimizer would)
        self._stateful = True
        self.steps_taken += 1
        # A gradient source's 16-bit gradients are converted for the step one bucket at a time,
        # each copy freed once its bucket is updated, unless something (clipping) already
        # prepared them all: then the step uses those.
        source = None if self._grads_ready else self._attached()
        if source is None:
            self.prepare_grads()
        for group, local_group in zip(self.param_groups, self.local.param_groups, strict=False):
            local_group.update(hyperparameters(group))  # (a group added since: not laid out yet)
        # Bucket by bucket: update this rank's pieces of a bucket, then start gathering that
        # bucket while the next one is updated (the wrapped optimizer skips pieces whose
        # gradient is None, so each step() call touches one bucket's pieces only).
        ready = [[shard.grad for shard in shards] for shards in self._shards] if source is None else None
        for shards in self._shards:
            for shard in shards:
                shard.grad = None
        kept: list[list[torch.Tensor | None]] = []  # what stays visible until zero_grad
        sync = self.parameter_sync
        try:
            for i, (b, flat, chunk, master, shards) in enumerate(
                zip(self.buckets, self.flats, self.chunks, self._masters, self._shards, strict=True)
            ):
                with profiled(f"shardbench::{self.label}::step"):
                    bucket_grads = ready[i] if ready is not None else self._bucket_grads(source, b)
                    # copies converted for the step (16-bit gradients) are not kept
                    kept.append(
                        [g if g is None or g.dtype == b.params[0].dtype else None for g in bucket_grads]
                    )
                    for shard, g in zip(shards, bucket_grads, strict=True):
                        shard.grad = g
                    if any(g is not None for g in bucket_grads):
                        self.local.step()
                    for shard in shards:
                        shard.grad = None
                    if master is not None:
                        chunk.copy_(master)  # the 16-bit parameters take the new fp32 values
                sync.updated(flat, chunk, self.label)
        finally:
            sync.finish(self.label)  # (also when a bucket's update raised)
        # Gradients stay visible until zero_grad, except copies converted for the step (bf16).
        for shards, bucket_grads in zip(self._shards, kept, strict=False):
            for shard, g in zip(shards, bucket_grads, strict=True):
                shard.grad = g
        self._grads_ready = False
        self._owed_unscale = None
        return loss

    @torch.no_grad()
    def unscale_grads_(self, inv_scale: torch.Tensor, found_inf: torch.Tensor) -> None:
        """Multiply this rank's gradient shards by ``inv_scale`` and set ``found_inf`` to 1 if
        any element is not finite (what ``GradScaler.unscale_`` does to a plain optimizer's
        gradients; ``ShardedGradScaler`` calls it and agrees ``found_inf`` across ranks). Full-
        precision gradients are unscaled in place; 16-bit ones are only checked here and
        unscaled as they are converted to fp32, for clipping or the step."""
        source = None if self._grads_ready else self._attached()
        if source is None:
            self.prepare_grads()
            grads = [s.grad for shards in self._shards for s in shards if s.grad is not None]
            _check_and_unscale(grads, found_inf, inv_scale)
            return
        converted = []
        for b, master in zip(self.buckets, self._masters, strict=True):
            chunk = source.gradient_chunk(b.index)
            if chunk is None:
                continue
            if master is None:  # the step reads the chunk itself
                _check_and_unscale([chunk], found_inf, inv_scale)
            else:
                converted.append(chunk)
        if converted:
            # 16-bit values hold inf/NaN exactly as their fp32 copies will: checked now, scaled later
            _check_and_unscale(converted, found_inf, torch.ones_like(inv_scale))
            self._owed_unscale = inv_scale.clone()

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)
        for shards in self._shards:
            for shard in shards:
                shard.grad = None
        self._grads_ready = False
        self._owed_unscale = None
        source = self._attached()
        if source is not None:
            source.on_zero_grad(set_to_none)

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip by the global gradient norm over all shards (as ``nn.utils.clip_grad_norm_``
        over the full model would); returns the total norm."""
        self.prepare_grads()
        grads = [s.grad for shards in self._shards for s in shards if s.grad is not None]
        device = self.flats[0].device if self.flats else torch.device("cpu")
        norm_type = float(norm_type)
        if norm_type == math.inf:
            local = (
                torch.stack([g.abs().max() for g in grads]).max() if grads else torch.zeros((), device=device)
            )
            total = local.float().clone()
            if self.world_size > 1:
                dist.all_reduce(total, op=dist.ReduceOp.MAX, group=self.process_group)
        else:
            local = (
                torch.stack([g.float().norm(norm_type) ** norm_type for g in grads]).sum()
                if grads
                else torch.zeros((), device=device)
            )
            total = local.clone()
            if self.world_size > 1:
                dist.all_reduce(total, group=self.process_group)
            total = total ** (1.0 / norm_type)
        coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
        return total

    @torch.no_grad()
    def clip_grad_value_(self, clip_value: float) -> None:
        """Clamp every gradient element to ``[-clip_value, clip_value]`` (elementwise, so each
        rank clamps its own shards and the result is what ``nn.utils.clip_grad_value_`` over the
        full model gives)."""
        self.prepare_grads()
        for shards in self._shards:
            for s in shards:
                if s.grad is not None:
                    s.grad.clamp_(-clip_value, clip_value)

    @property
    def masters(self) -> list[torch.Tensor | None]:
        """Per bucket, this rank's fp32 master copy of its chunk (low-precision parameters), or
        None where the chunk itself is what the optimizer updates."""
        return self._masters

    def refresh_master_weights(self) -> None:
        """Re-read fp32 master copies from the (low-precision) parameters, e.g. after loading a
        model checkpoint into them."""
        for chunk, master in zip(self.chunks, self._masters, strict=True):
            if master is not None:
                master.copy_(chunk)

    @torch.no_grad()
    def adopt_whole_values(self) -> None:
        """The flat buffers hold whole values again (stage 3's units gathered, perhaps written
        to by the user): take this rank's part of them into its chunks and fp32 masters, where
        they differ, so that the step goes on from what was written."""
        for b, flat, chunk, master in zip(self.buckets, self.flats, self.chunks, self._masters, strict=True):
            whole = flat[b.chunk_start : b.chunk_start + b.chunk]
            if not torch.equal(whole, chunk):
                chunk.copy_(whole)
                if master is not None:
                    master.copy_(whole)

    # ----- accounting --------------------------------------------------------------------------
    def memory_tensors(self) -> dict[str, list[torch.Tensor]]:
        """Tensors by category for memory accounting: fp32 master weights are optimizer state
        (the ZeRO paper's K=12 counts them there)."""
        return {"optimizer": [m for m in self._masters if m is not None]}

    # ----- checkpoints -------------------------------------------------------------------------
    def _param_index(self) -> dict[int, int]:
        """id(param) -> index in the plain optimizer's state_dict numbering (over all groups)."""
        return {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather the full optimizer state on rank ``to`` (a collective: call on every rank)."""
        payload = state_pieces(self._owned_state())
        gathered: list[Any] | None = [None] * self.world_size if self.rank == to else None
        if self.world_size > 1:
            dist.gather_object(
                payload, gathered, dst=global_rank(self.process_group, to), group=self.process_group
            )
        else:
            gathered = [payload]
        self._consolidated = assemble_full_state(self.param_groups, gathered) if self.rank == to else None

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """The consolidated state, in the plain optimizer's format (load it into ``optim`` over
        the same parameters, or into a ShardedOptimizer of any world size)."""
        if self._consolidated is None:
            raise RuntimeError(
                "call consolidate_state_dict(to=RANK) on every rank first; state_dict() "
                "is then available on rank RANK"
            )
        return self._consolidated

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        """Load a full (plain-format) state dict; each rank keeps the slices it owns."""
        assert self.local is not None
        self._stateful = True
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
            len(g["params"]) != len(s["params"]) for g, s in zip(groups, self.param_groups, strict=True)
        ):
            raise ValueError("state dict parameter groups do not match this optimizer's groups")
        for g, saved in zip(self.param_groups, groups, strict=True):
            g.update({k: v for k, v in saved.items() if k != "params"})
        self._place_state({int(k): v for k, v in state_dict["state"].items()})
        for group, local_group in zip(self.param_groups, self.local.param_groups, strict=False):
            local_group.update(hyperparameters(group))
        self.refresh_master_weights()
        self._consolidated = None


def _check_and_unscale(grads: list[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor) -> None:
    """torch's fused check-and-unscale over ``grads``, one call per device and dtype."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for g in grads:
        groups.setdefault((g.device, g.dtype), []).append(g)
    for (device, _), same in groups.items():
        flag = found_inf if found_inf.device == device else torch.zeros_like(found_inf, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(same, flag, inv_scale.to(device))
        if flag is not found_inf:
            found_inf.copy_(torch.maximum(found_inf, flag.to(found_inf.device)))


def _as(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The gradient in the shard's dtype (a view when it already matches)."""
    return grad if grad.dtype == like.dtype else grad.to(like.dtype)
