"""The analytical ZeRO memory model: predicted model-state bytes per rank.

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

The prediction is driven by a strategy's declared ``Sharding``, not its name, so a new strategy
gets the right formula by declaring what it shards; ``FORMULAS`` names the paper's rows. A
strategy's storage precision is what it really keeps: DDP-style strategies run bf16 as autocast
over fp32 parameters (4+4+8), ours keep bf16 parameters with fp32 masters (2+2+12); see
``Strategy.model_state_precision``. It counts model states only: activations, buffers, inputs and
communication buckets are what the measured breakdown adds on top.
"""

from __future__ import annotations

from dataclasses import dataclass

# bytes per parameter: (parameter, gradient, optimizer state incl. master weights)
_BYTES = {"fp32": (4, 4, 8), "bf16": (2, 2, 12)}


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
) -> dict[str, int]:
    """Per-rank bytes of params, grads and optimizer state (and their total) for AdamW, for the
    largest rank. ``group_sizes`` (elements of each parameter in each optimizer group) is needed
    for ``whole_parameters`` partitions."""
    if precision not in _BYTES:
        raise ValueError(f"unknown precision {precision!r}; allowed: {', '.join(_BYTES)}")
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    p, g, o = _BYTES[precision]

    def share(nbytes_per_param: int, sharded: bool) -> int:
        total = nbytes_per_param * num_params
        return -(-total // world_size) if sharded else total  # ceil: the largest rank's share

    optimizer = share(o, sharding.optimizer_state)
    if sharding.optimizer_state and sharding.whole_parameters:
        if group_sizes is None:
            raise ValueError("a whole-parameter partition needs the parameter sizes (group_sizes)")
        optimizer = o * max(whole_parameter_partition(group_sizes, world_size))
    out = {
        "params": share(p, sharding.parameters),
        "grads": share(g, sharding.gradients),
        "optimizer": optimizer,
    }
    out["total"] = sum(out.values())
    return out
