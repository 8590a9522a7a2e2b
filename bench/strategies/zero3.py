"""``zero3``: our ShardedOptimizer with ``ShardedDataParallel(stage=3)``: optimizer state,
gradients and parameters sharded; each unit (a transformer layer, a ResNet block: the default
unit policy) gathered only while it runs.

Memory accounting, per rank: this rank's parameter chunks and the unit buffers gathered at the
moment are "params" (a gathered buffer *is* the module's parameters, and its size is what
parameter sharding trades against communication), gradient shards "grads", fp32 masters and
AdamW state "optimizer", and the full-gradient buffers waiting for their reduction "other"
(communication buffers, as zero2's buckets)."""

from __future__ import annotations

from typing import Any

from bench.strategies.sharded.stage3 import ShardedDataParallel3
from bench.strategies.zero2 import Zero2Strategy


class Zero3Strategy(Zero2Strategy, card="zero3"):
    """zero2's strategy with stage 3: the same optimizer, teardown and memory accounting."""

    stage = 3

    def settings(self) -> dict[str, Any]:
        units = getattr(self.model, "units", None)
        cap = "bucket_cap_mb"  # buckets follow units here, whatever their size
        return {
            **{k: v for k, v in super().settings().items() if k != cap},
            "partition": "one flat buffer per unit and param group, element-balanced",
            "units": "each parameterised child of an nn.ModuleList/nn.Sequential, then the root",
            "unit_count": len(units) if units is not None else None,
            "prefetch": "one unit ahead in forward and backward; at most two units whole besides the root",
            "max_buckets_in_flight": ShardedDataParallel3.max_in_flight,
        }
