"""The analytical ZeRO model: predicted model-state bytes per rank, and (at the end of this
module) the bytes each rank communicates per step.

From the ZeRO paper (Rajbhandari et al., 2020, section 5): with Psi parameters, model states are
parameters + gradients + optimizer state. fp32 AdamW keeps 4 (param) + 4 (grad) + 8 (exp_avg,
exp_avg_sq) bytes per parameter; bf16 mixed precision keeps 2 + 2 + K with K = 12 (fp32 master
weights, exp_avg, exp_avg_sq). Each sharded term is divided by the world size N:

=========  ================  ==================
strategy   fp32 (AdamW)      bf16 mixed (K=12)
=========  ================  ==================
ddp        16 Psi            16 Psi
zero1      4+4+8/N Psi       2+2+12/N Psi
zero2      4+12/N Psi        2+14/N Psi
zero3      16/N Psi          16/N Psi
=========  ================  ==================

torch-zero1 (PyTorch's ZeroRedundancyOptimizer) shards whole parameters, not elements: it sorts
each parameter group by size and gives each tensor to the rank holding the fewest elements so far.
Its largest rank can hold far more than 1/N (BERT's 23M-element word embedding alone is 1/5 of
bert-base), so its prediction replays that partition on the actual parameter sizes
(``whole_parameter_partition``) and takes the largest rank's share, not the ideal Psi/N.

Which bytes each term counts, per rank:

* params: the parameter storage a rank keeps between steps, plus, when parameters are not sharded,
  the full replica (for FSDP2's ``reshard_after_forward=False`` "zero2" that is the unsharded
  parameters it holds from forward to the end of backward, i.e. at its peak, not between steps);
* grads: the gradient storage that survives backward (DDP: its buckets, of which the gradients
  are views; ZeRO-2/3: the rank's reduced shard);
* optimizer: AdamW's ``exp_avg`` and ``exp_avg_sq`` (and fp32 master weights in bf16 mixed
  precision) for the elements the rank updates. The 4-byte ``step`` counters per tensor are left
  out (under 0.01% for the presets here).

zero3 (ours and ``fsdp2-zero3``) keeps only 16 Psi / N of model states between uses, but a rank
also needs a *working set* while it computes, which this model leaves to the measurement (it
depends on the unit sizes, not on Psi alone): the full parameters of the units gathered at the
moment (the root unit, kept from its forward to its backward, and the unit running) and the full
gradient buffers of the unit in backward and of at most two whose reductions are in flight. So,
roughly, its peak is model states + the two largest units' full parameters and gradients +
activations. With a dominant root (BERT's embeddings are ~22% of bert-base) the measured "params"
at the peak sit well above 4 Psi / N, while the model states measured between steps equal the
prediction.

Hybrid sharding (a shard width S: shard within groups of S ranks, replicate across the N/S
groups) keeps what is sharded once per group: each sharded term is divided by S instead of N
(zero3 at S: 16 Psi / S), what is replicated stays whole.

The prediction is driven by a strategy's declared ``Sharding``, not its name, so a new strategy
gets the right formula by declaring what it shards; ``FORMULAS`` names the paper's rows. A
strategy's storage precision is what it really keeps: DDP-style strategies run bf16 as autocast
over fp32 parameters (4+4+8), ours keep bf16 parameters with fp32 masters (2+2+12); see
``Strategy.model_state_precision``. It counts model states only: activations, buffers, inputs and
communication buckets are what the measured breakdown adds on top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardbench.metrics.topology import (
    NO_BYTES,
    PASSES,
    TierBytes,
    replica_group_ranks,
    ring_factor,
    shard_group_ranks,
    tier_bytes,
    tiers_json,
)
from shardbench.precision import MODEL_STATE_BYTES


@dataclass(frozen=True, kw_only=True)
class Sharding:
    """What a strategy partitions across ranks: the one fact the prediction needs about it.

    Each strategy declares one (``Strategy.sharding``), so the formula follows from what it
    shards, never from its name."""

    #: optimizer state (and fp32 master weights) held only for the rank's share
    optimizer_state: bool = False
    #: reduced gradients kept only for the rank's share after backward
    gradients: bool = False
    #: parameters sharded between steps (gathered when needed)
    parameters: bool = False
    #: optimizer state partitioned by whole tensors (greedy by size) rather than evenly by elements
    whole_parameters: bool = False


#: the ZeRO paper's rows, named; strategies declare one of these (or a variant of it)
REPLICATED = Sharding()
ZERO1 = Sharding(optimizer_state=True)
ZERO2 = Sharding(optimizer_state=True, gradients=True)
ZERO3 = Sharding(optimizer_state=True, gradients=True, parameters=True)

#: the paper's table (and DP's row, which keeps a full replica like DDP)
FORMULAS: dict[str, Sharding] = {
    "dp": REPLICATED,
    "ddp": REPLICATED,
    "zero1": ZERO1,
    "zero2": ZERO2,
    "zero3": ZERO3,
}


def whole_parameter_partition(group_sizes: list[list[int]], world_size: int) -> list[int]:
    """Elements of optimizer state per rank under ZeroRedundancyOptimizer's partition: for each
    parameter group, tensors sorted by size (largest first), each to the rank with the fewest
    elements so far (lowest rank on ties), as ``_partition_parameters`` does in torch 2.11."""
    totals = [0] * world_size
    for sizes in group_sizes:
        for n in sorted(sizes, reverse=True):
            rank = totals.index(min(totals))
            totals[rank] += n
    return totals


def predicted_model_state_bytes(
    num_params: int,
    world_size: int,
    precision: str,
    sharding: Sharding,
    group_sizes: list[list[int]] | None = None,
    trainable: int | None = None,
    shard_size: int | None = None,
) -> dict[str, int]:
    """Per-rank bytes of params, grads and optimizer state (and their total) for AdamW, for the
    largest rank. ``group_sizes`` (elements of each parameter in each optimizer group) is needed
    for ``whole_parameters`` partitions. ``trainable``: the parameters that take gradients
    (default: all); a frozen parameter is held (and sharded with the parameters) but has neither
    gradient nor optimizer state. ``shard_size``: hybrid sharding's S, the ranks each sharded
    term is divided among (default: all ``world_size``)."""
    if precision not in MODEL_STATE_BYTES:
        raise ValueError(f"unknown precision {precision!r}; allowed: {', '.join(MODEL_STATE_BYTES)}")
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    p, g, o = MODEL_STATE_BYTES[precision]
    shards = world_size if shard_size is None else shard_size

    learning = num_params if trainable is None else trainable

    def share(nbytes_per_param: int, sharded: bool, count: int = learning) -> int:
        total = nbytes_per_param * count
        return -(-total // shards) if sharded else total  # ceil: the largest rank's share

    optimizer = share(o, sharding.optimizer_state)
    if sharding.optimizer_state and sharding.whole_parameters:
        if group_sizes is None:
            raise ValueError("a whole-parameter partition needs the parameter sizes (group_sizes)")
        optimizer = o * max(whole_parameter_partition(group_sizes, shards))
    out = {
        "params": share(p, sharding.parameters, num_params),
        "grads": share(g, sharding.gradients),
        "optimizer": optimizer,
    }
    out["total"] = sum(out.values())
    return out


# --- communication -------------------------------------------------------------------------
#
# What a rank sends per step, by ZeRO's accounting (section 7 of the paper): with Psi parameters,
# DDP all-reduces the gradients (2 Psi elements sent per rank by a ring, times (N-1)/N); ZeRO-1
# and ZeRO-2 reduce-scatter them and all-gather the updated parameters (Psi + Psi: the same 2 Psi);
# ZeRO-3 gathers the parameters in forward and again in backward (3 Psi, 1.5x). Frozen parameters
# (no gradient) are never reduced; where parameters are sharded (zero3, FSDP2) they are sharded
# and gathered with their unit like the trainable ones, elsewhere they stay whole on every rank
# and are never sent. The prediction counts a frozen parameter's unit as gathered again for
# backward like any other, which holds wherever a gradient passes through the unit (any unit
# holding a trainable parameter or coming after one); a unit of frozen parameters only, run
# before any trainable one, has no backward and is gathered once. The element size
# is what each strategy really communicates (``Communication``), and the prediction is per
# operator kind so it can be set against what ``bench/metrics/comm.py`` counts. What it leaves
# out, and the measurement shows as it is: buffers broadcast each forward (DDP's
# ``broadcast_buffers``, ours), our used-parameter flags (one small all-reduce), and the padding
# of our flat buckets to N equal chunks (at most N-1 elements per bucket).

#: the fraction of a collective's full size a ring sends per rank, for a world of n
RING = {kind: (lambda n, kind=kind: ring_factor(kind, n)) for kind in PASSES}


#: from this world size on, our ZeRO on gloo reduces each gradient chunk to its owner rather
#: than all-reducing
GLOO_REDUCE_FROM = 4


def sharded_gradient_collective(backend: str, world_size: int) -> str:
    """How our ZeRO's reducer reduces gradients on ``backend`` at ``world_size`` ranks: what it
    runs and what the prediction counts. Reduce-scatter, except on gloo, whose reduce-scatter
    takes 1.5-1.8x its all-reduce's time for the same bucket (docs/measuring.md, "Our ZeRO on
    gloo"). There, below ``GLOO_REDUCE_FROM`` ranks each bucket is all-reduced in place and each
    rank keeps its chunk; from it on, each chunk is reduced to its owner, which sends half the
    bytes and measured faster at N=4 (0.66-0.84x the all-reduce's time) but slower at N=2
    (1.2x)."""
    if backend != "gloo":
        return "reduce_scatter"
    return "reduce" if world_size >= GLOO_REDUCE_FROM else "all_reduce"


@dataclass(frozen=True, kw_only=True)
class Communication:
    """What a strategy communicates in a step, declared by the strategy for a precision and a
    backend (``Strategy.communication``), so the prediction follows from what it does."""

    #: how gradients are reduced at every world size: "all_reduce" (DDP) or "reduce_scatter";
    #: None where our ZeRO's reducer chooses by world size (``reducer_backend``)
    gradients: str | None = None
    #: the backend our ZeRO's reducer runs on, whose collective follows the world size
    #: (``sharded_gradient_collective``); None where ``gradients`` names the collective
    reducer_backend: str | None = None
    #: bytes per element of the gradients as communicated
    gradient_bytes: int
    #: how updated or sharded parameters reach the ranks: "all_gather", "broadcast" (torch-zero1:
    #: each parameter from the rank that updated it), or None
    parameters: str | None = None
    parameter_bytes: int = 0
    #: how many times a step gathers the parameters (zero3, FSDP2: in forward and in backward)
    gathers: int = 1
    #: the root unit stays gathered from forward into backward (ours), so backward does not
    #: gather it again
    root_kept: bool = False
    #: frozen parameters are sharded too and gathered with their unit at each of its gathers
    #: (zero3, FSDP2); otherwise they stay whole on every rank and are never sent
    frozen_gathered: bool = False
    #: each parameter is sharded on dim 0, padded to a multiple of N (FSDP2's ``Shard(0)``),
    #: rather than packed into flat buckets
    dim0_padding: bool = False
    #: where it shards in groups smaller than the world, the backend our ZeRO's reducer runs on
    #: then (zero1 on gloo keeps DDP's all-reduce only over the whole world); None: as flat
    grouped_reducer_backend: str | None = None
    #: each gather writes into memory allocated for it, freed once its unit is done (zero3's
    #: and FSDP2's per-unit gathers), rather than into buffers kept across steps
    gathers_into_fresh_memory: bool = False
    #: each gather's parameters are then copied out of its buffer into memory of their own, and
    #: the gradients into a reduce-scatter buffer of their own, both allocated afresh (FSDP2's
    #: copy-out and copy-in); our ZeRO computes in views of its flat buffers
    copies_through_buffers: bool = False
    #: each gradient is copied into a bucket kept across steps, which is what gets reduced
    #: (DDP's buckets, our ZeRO's reducer, DeepSpeed's): a copy of every gradient byte a step
    copies_gradients_into_buckets: bool = False
    #: ZeRO++'s hierarchical partitioning (hpZ): where it shards in groups smaller than the
    #: world, backward gathers from a secondary copy of the parameters partitioned within the
    #: group, while forward's gathers and the gradients' reduction still span all N
    secondary_gather: bool = False

    def __post_init__(self) -> None:
        if (self.gradients is None) == (self.reducer_backend is None):
            raise ValueError("a Communication reduces gradients one way: give gradients or reducer_backend")

    def gradient_collective(self, world_size: int, *, grouped: bool = False) -> str:
        """The collective the gradients are reduced with at ``world_size`` ranks (``grouped``:
        within a shard group smaller than the world)."""
        if grouped and self.grouped_reducer_backend is not None:
            return sharded_gradient_collective(self.grouped_reducer_backend, world_size)
        if self.reducer_backend is not None:
            return sharded_gradient_collective(self.reducer_backend, world_size)
        assert self.gradients is not None
        return self.gradients


def _padded(dims: tuple[tuple[int, int], ...], world_size: int) -> int:
    return sum(-(-d // world_size) * world_size * (n // d) if d else n for d, n in dims)


@dataclass(frozen=True)
class CommShape:
    """What the communication prediction needs of a model: its trainable and its frozen
    parameters' shapes (dim 0 and element count each), and the elements of each kind in zero3's
    root unit."""

    dims: tuple[tuple[int, int], ...]  # (dim 0, numel) per trainable parameter
    root_elements: int = 0
    frozen: tuple[tuple[int, int], ...] = ()  # (dim 0, numel) per frozen parameter
    root_frozen_elements: int = 0

    @property
    def elements(self) -> int:
        return sum(n for _, n in self.dims)

    @property
    def frozen_elements(self) -> int:
        return sum(n for _, n in self.frozen)

    def padded(self, world_size: int) -> int:
        """Trainable elements once each parameter's dim 0 is padded to a multiple of
        ``world_size``."""
        return _padded(self.dims, world_size)

    def frozen_padded(self, world_size: int) -> int:
        """The same for the frozen parameters."""
        return _padded(self.frozen, world_size)


@dataclass(frozen=True)
class Send:
    """One kind of collective a rank issues in a step over one group: the bytes of its full
    tensors, the ranks of its ring, and the group ("world", or hybrid sharding's "shard" and
    "replicate")."""

    kind: str
    nbytes: int
    ranks: int
    group: str = "world"
    #: what it moves: the gradients' reduction, the parameters' gathers, or the replicas'
    #: average of each reduced chunk
    purpose: str = "gradients"

    def group_ranks(self, world_size: int, shard_size: int, rank: int = 0) -> list[int]:
        """The global ranks of ``rank``'s group of this kind (consecutive shard groups)."""
        if self.group == "shard":
            return shard_group_ranks(rank, world_size, shard_size)
        if self.group == "replicate":
            return replica_group_ranks(rank, world_size, shard_size)
        return list(range(world_size))


def comm_sends(
    comm: Communication, shape: CommShape, world_size: int, shard_size: int | None = None
) -> list[Send]:
    """What a rank communicates in a step, collective by collective group (``predicted_comm``
    sums them). ``shard_size`` S < N (hybrid sharding): the gradients are reduced and the
    parameters gathered within the shard group of S ranks, and each reduced chunk (1/S of the
    gradients) is then all-reduced across the N/S ranks holding it (``replicate``); with
    ``secondary_gather`` (ZeRO++'s hpZ) only backward's gathers stay within the group."""
    s = world_size if shard_size is None else shard_size
    grouped = s < world_size
    secondary = grouped and comm.secondary_gather
    span = world_size if secondary else s  # the ranks gradients are reduced over
    inside = "shard" if grouped and not secondary else "world"  # where those collectives run
    elements = shape.padded(span) if comm.dim0_padding else shape.elements
    reduced = comm.gradient_collective(span, grouped=inside != "world")
    sends = [Send(reduced, elements * comm.gradient_bytes, span, inside, "gradients")]
    if comm.parameters is not None:
        sharded, root = elements, shape.root_elements
        if comm.frozen_gathered:
            sharded += shape.frozen_padded(span) if comm.dim0_padding else shape.frozen_elements
            root += shape.root_frozen_elements
        kept = root if comm.root_kept and comm.gathers > 1 else 0
        size = comm.parameter_bytes
        if secondary:  # forward from the primary partitions, backward from the secondary
            sends.append(Send(comm.parameters, sharded * size, world_size, "world", "parameters"))
            backward = ((comm.gathers - 1) * sharded - kept) * size
            sends.append(Send(comm.parameters, backward, s, "shard", "parameters"))
        else:
            gathered = (comm.gathers * sharded - kept) * size
            sends.append(Send(comm.parameters, gathered, s, inside, "parameters"))
    if grouped and not secondary:
        chunk = -(-elements // s) * comm.gradient_bytes
        sends.append(Send("all_reduce", chunk, world_size // s, "replicate", "replicas"))
    return sends


def predicted_comm(
    comm: Communication,
    shape: CommShape,
    world_size: int,
    shard_size: int | None = None,
    ranks_per_node: int | None = None,
) -> dict[str, Any]:
    """Per operator kind, the bytes of the full tensors a rank communicates in a step and what a
    ring sends per rank for them; ``sent_per_rank`` in all (``comm.py``'s summary, predicted).
    Where it shards in groups (``comm_sends``), ``groups`` gives what a rank sends within its
    shard group and across replicas; with ``ranks_per_node`` G, ``tiers`` gives, per kind, what
    rank 0 sends within its node and across nodes (``topology.tier_bytes``)."""
    s = world_size if shard_size is None else shard_size
    grouped = s < world_size
    sends = comm_sends(comm, shape, world_size, shard_size)
    ops: dict[str, dict[str, int]] = {}
    groups: dict[str, int] = {}
    for send in sends:
        sent = round(send.nbytes * RING[send.kind](send.ranks))
        entry = ops.setdefault(send.kind, {"bytes": 0, "sent_per_rank": 0})
        entry["bytes"] += send.nbytes
        entry["sent_per_rank"] += sent
        if send.group != "world":
            groups[send.group] = groups.get(send.group, 0) + sent
    out: dict[str, Any] = {
        "world_size": world_size,
        "ops": dict(sorted(ops.items())),
        "sent_per_rank": sum(v["sent_per_rank"] for v in ops.values()),
    }
    if grouped:
        out["shard_group"] = s
        out["groups"] = dict(sorted(groups.items()))
    if ranks_per_node is not None:
        out["ranks_per_node"] = ranks_per_node
        out["tiers"] = tiers_of(sends, world_size, s, ranks_per_node)
    return out


def tiers_of(
    sends: list[Send], world_size: int, shard_size: int, ranks_per_node: int
) -> dict[str, dict[str, int]]:
    """Per kind, the bytes rank 0 sends within its node and across nodes (``tier_bytes``)."""
    tiers: dict[str, TierBytes] = {}
    for send in sends:
        split = tier_bytes(send.kind, send.nbytes, send.group_ranks(world_size, shard_size), ranks_per_node)
        tiers[send.kind] = tiers.get(send.kind, NO_BYTES) + split
    return tiers_json(tiers)
