"""Our ZeRO implementation: two small public classes, usable in any training loop.

- ``ShardedOptimizer(params, optim=torch.optim.AdamW, **optim_kwargs)``: stage 1, optimizer
  state sharded. Composes with plain ``DistributedDataParallel`` (full gradients all-reduced),
  as FairScale's OSS does, or with ``ShardedDataParallel(module, opt, stage=1)``, which reduces
  each gradient bucket to its owners (reduce-scatter: DDP's bytes per step, where DDP followed by
  the parameters' all-gather sends 1.5x); that pairing is the ``zero1`` strategy.
- ``ShardedDataParallel(module, sharded_optimizer)``: stage 2, gradients reduce-scattered to
  their owners during backward and kept only as shards; the ``zero2`` strategy.
- ``ShardedDataParallel(module, sharded_optimizer, stage=3, unit=None)``: stage 3, parameters
  sharded too: each *unit* (``unit``: a callable ``module -> bool``; default: every child of an
  ``nn.ModuleList``/``nn.Sequential`` holding parameters, and the root for the rest) is gathered
  just before its forward and again before its backward, and freed after each (``gatherer.py``,
  ``units.py``); frozen parameters (``requires_grad=False``) are sharded and gathered with their
  unit too, with no gradient and no optimizer state (``frozen.py``); ``full_state_dict()``
  consolidates the model (a collective). The ``zero3`` strategy.
- ``ShardedDataParallel(..., shard_group_size=S)``: hybrid sharding at any stage: shard within
  groups of S consecutive ranks, replicate across the N/S groups (``groups.py``); each reduced
  chunk is then all-reduced across the replicas, and stage 3 gathers within its group.

In anyone's loop: wrapping starts every rank from rank 0's parameters (frozen ones included) and
buffers (``broadcast.py``); a ``requires_grad`` flipped or a group added with
``add_param_group`` between steps is laid out again at the next forward, optimizer state kept
(``ShardedDataParallel._relayout_if_changed``, ``ShardedOptimizer.relayout``); between uses a
stage-3 parameter refuses reads of its values in one line (``free_parameter.py``), and they are
read through ``full_state_dict()``, the
wrapper's ``state_dict()`` or ``summon_full_params()`` (``reads.py``).

How it is put together: a frozen ``StagePlan`` (``stages.py``) says what a stage shards, and
every part reads it. ``ShardedDataParallel`` (``data_parallel.py``) composes a
``GradientReducer`` (``reducer.py``, every stage) and, for stage 3, a ``UnitGatherer``
(``gatherer.py``); the optimizer brings the updated chunks to every rank through a
``ParameterSync`` (``parameter_sync.py``: all-gathered after the step at stages 1-2, gathered
unit by unit by the wrapper at stage 3). A buffer a collective used is freed at a fixed
point, not whenever the process group's thread lets go of it (``release.py``): the peak is the
same bytes run to run.
The optimizer knows the wrapper only through ``attach`` (the reducer becomes
its ``GradientSource``) and, for stage 3, ``shard_parameters`` (it keeps only its chunks). The
optimizer owns only what it optimizes: stage 3's frozen parameters are kept, as chunks, by the
gatherer (``FrozenShards``), and stages 1 and 2 leave them whole in the module.

What lives where, per rank, with Psi parameters and N ranks (fp32 AdamW):

=================  ===========================  ===========================  ===========================
                   zero1 (+ DDP)                zero2                        zero3
=================  ===========================  ===========================  ===========================
parameters         full (4 Psi), flat buckets   full (4 Psi), flat buckets   own chunk (4 Psi / N); a
                                                                             unit whole while it runs
                                                                             (frozen ones included)
gradients          full (4 Psi, buckets)        own chunk (4 Psi / N)        own chunk (4 Psi / N)
optimizer state    own chunk (8 Psi / N)        own chunk (8 Psi / N)        own chunk (8 Psi / N)
in flight (comm)   the buckets are the grads    <= 2 reduce buckets +        one unit reducing, one
                                                filling ones                 being added in
=================  ===========================  ===========================  ===========================

With bf16 parameters each rank also keeps an fp32 master copy of its chunk (4 Psi / N), so model
states are 2 Psi + 2 Psi + 12 Psi / N (stage 1), 2 Psi + 14 Psi / N (stage 2, gradient shards
in bf16, cast to fp32 for the optimizer step) and 16 Psi / N (stage 3, split 2 + 2 + 12).

Partitioning (``layout.py``): parameters are packed into flat buckets, each padded to a multiple
of N and split into N equal chunks; rank r owns chunk r of every bucket. This is balanced to the
element, unlike whole-parameter partitions, and each bucket is one equal-chunk collective. Stage 3
re-packs the buckets one per unit (and param group), so a unit is gathered by its own buckets.

Usage in a training loop::

    opt = ShardedOptimizer(model.parameters(), optim=torch.optim.AdamW, lr=1e-4)
    model = ShardedDataParallel(model, opt)          # stage=1: full gradients kept (or plain
                                                     # DDP); stage=3: parameters sharded too
    for batch in data:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(batch)).backward()
        opt.clip_grad_norm_(1.0)                     # global norm across shards
        opt.step()
    # fp16: scaler = ShardedGradScaler(device); scaler.scale(loss).backward(); scaler.unscale_(opt)
    # before clipping; scaler.step(opt); scaler.update() (``scaler.py``: torch's own GradScaler
    # sees no sharded gradient)
    opt.consolidate_state_dict(to=0)                 # collective; then on rank 0:
    if rank == 0: torch.save(opt.state_dict(), path) # plain optimizer format, any world size
"""

from shardbench.strategies.sharded.data_parallel import ShardedDataParallel
from shardbench.strategies.sharded.optimizer import ELEMENTWISE_OPTIMIZERS, ShardedOptimizer
from shardbench.strategies.sharded.scaler import ShardedGradScaler

__all__ = ["ELEMENTWISE_OPTIMIZERS", "ShardedDataParallel", "ShardedGradScaler", "ShardedOptimizer"]
