"""``ShardedGradScaler``: fp16 loss scaling for an optimizer whose gradients are sharded.

``torch.amp.GradScaler`` unscales and checks ``param.grad`` of every parameter in the
optimizer's groups. Under ``ShardedDataParallel`` (stages 1-3) those are None: each rank's
gradients live in its reduced shard, so the stock scaler finds nothing ("No inf checks were
recorded for this optimizer"). This drop-in subclass (FairScale's and FSDP's name for the same
thing) asks a ``ShardedOptimizer`` to unscale its own shards, then agrees ``found_inf`` across
the optimizer's ranks: an overflow in one element is seen after the reduction only by the rank
that owns that element, and every rank must skip the same step and back off to the same scale.
The agreement is a blocking all-reduce, so ``found_inf`` is read only once every rank's flag
is in it. The loop is torch's, unchanged::

    scaler = ShardedGradScaler("cuda")               # or "cpu"
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(batch))
    scaler.scale(loss).backward()
    scaler.unscale_(opt)                             # optional: before clipping
    opt.clip_grad_norm_(1.0)
    scaler.step(opt)                                 # skipped on every rank if any rank overflowed
    scaler.update()

With any other optimizer it is the stock scaler, plus the same agreement over the default group
(with DDP's all-reduced gradients every rank already agrees; with gradients that differ per
rank it keeps the ranks in step).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from shardbench.strategies.sharded.optimizer import ShardedOptimizer


class ShardedGradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` for ``ShardedOptimizer`` (see the module docstring)."""

    def _unscale_grads_(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        found_inf: torch.Tensor,
        allow_fp16: bool,
    ) -> dict[torch.device, torch.Tensor]:
        if isinstance(optimizer, ShardedOptimizer):
            # 16-bit parameters keep fp32 masters: their gradients are unscaled as fp32 copies
            optimizer.unscale_grads_(inv_scale, found_inf)
            group, ranks = optimizer.process_group, optimizer.world_size
        else:
            per_device = super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
            for flag in per_device.values():
                if flag is not found_inf:
                    found_inf.copy_(torch.maximum(found_inf, flag.to(found_inf.device)))
            group = None
            ranks = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if ranks > 1:  # blocking: the flag is read only after every rank's is in it
            dist.all_reduce(found_inf, op=dist.ReduceOp.MAX, group=group)
        # one entry always, also on a rank whose shards hold no gradient: update() needs one
        return {found_inf.device: found_inf}
