"""Our ZeRO implementation: two small public classes, usable in any training loop.

- ``ShardedOptimizer(params, optim=torch.optim.AdamW, **optim_kwargs)``: stage 1, optimizer
  state sharded. Composes with plain ``DistributedDataParallel`` (full gradients all-reduced),
  as FairScale's OSS does; that pairing is the ``zero1`` strategy.
- ``ShardedDataParallel(module, sharded_optimizer)``: stage 2, gradients reduce-scattered to
  their owners during backward and kept only as shards; the ``zero2`` strategy.

What lives where, per rank, with Psi parameters and N ranks (fp32 AdamW):

=====================  =========================  ==========================
                       zero1 (+ DDP)              zero2
=====================  =========================  ==========================
parameters             full (4 Psi), flat buckets  full (4 Psi), flat buckets
gradients              full (4 Psi, DDP buckets)   own chunk (4 Psi / N)
optimizer state        own chunk (8 Psi / N)       own chunk (8 Psi / N)
in flight (other)      DDP's buckets are the grads <= 2 reduce buckets + filling ones
=====================  =========================  ==========================

With bf16 parameters each rank also keeps an fp32 master copy of its chunk (4 Psi / N), so model
states are 2 Psi + 2 Psi + 12 Psi / N (stage 1) and 2 Psi + 14 Psi / N (stage 2, gradient shards
in bf16, cast to fp32 for the optimizer step).

Partitioning (``layout.py``): parameters are packed into flat buckets, each padded to a multiple
of N and split into N equal chunks; rank r owns chunk r of every bucket. This is balanced to the
element, unlike whole-parameter partitions, and each bucket is one equal-chunk collective.

Usage in a training loop::

    opt = ShardedOptimizer(model.parameters(), optim=torch.optim.AdamW, lr=1e-4)
    model = ShardedDataParallel(model, opt)          # omit for stage 1 (use DDP instead)
    for batch in data:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(batch)).backward()
        opt.clip_grad_norm_(1.0)                     # global norm across shards
        opt.step()
    opt.consolidate_state_dict(to=0)                 # collective; then on rank 0:
    if rank == 0: torch.save(opt.state_dict(), path) # plain optimizer format, any world size
"""

from bench.strategies.sharded.data_parallel import ShardedDataParallel
from bench.strategies.sharded.optimizer import ELEMENTWISE_OPTIMIZERS, ShardedOptimizer

__all__ = ["ELEMENTWISE_OPTIMIZERS", "ShardedDataParallel", "ShardedOptimizer"]
