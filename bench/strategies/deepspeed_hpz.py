"""``deepspeed-zero3-hpz``: DeepSpeed ZeRO-3 with ZeRO++'s hierarchical partitioning (hpZ),
``zero_hpz_partition_size`` = S.

Configured as DeepSpeed's ZeRO++ tutorial enables hpZ: ``zero_hpz_partition_size`` set to the
ranks of a group (a node's GPUs there), over ``deepspeed-zero3``'s configuration. Its other two
parts, quantized weights and gradients (``zero_quantized_weights``,
``zero_quantized_gradients``), stay off: they change the arithmetic, and every strategy here
trains with the same optimizer math.

What S means for it differs from HSDP's: gradients and optimizer state stay partitioned over
all N ranks, and so do the parameters' primary partitions, which forward gathers from all N.
After forward, each rank keeps a secondary copy of 1/S of the parameters, partitioned within
its group of S consecutive ranks, from which backward gathers without leaving the group; the
step drops it, so between steps a rank holds what flat ZeRO-3 holds (1/N of every state).
Where DeepSpeed keeps a parameter whole through backward (below its persistence threshold, or
reused within its reuse distance: on the small models measured here, every step after the
first) backward gathers nothing, so the bytes sent are at most what the accounting declares,
as for deepspeed-zero3.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shardbench.metrics.analytic import Communication
from shardbench.strategies.base import RankContext
from shardbench.strategies.deepspeed_zero import DeepSpeedZero3Strategy


class DeepSpeedZero3HpZStrategy(DeepSpeedZero3Strategy, card="deepspeed-zero3-hpz"):
    def engine_config(self, ctx: RankContext, num_params: int) -> dict[str, Any]:
        """deepspeed-zero3's, with hpZ over groups of S; at S = N, DeepSpeed's default of 1
        (hpZ off: a secondary partition over the whole world would be the primary one again)."""
        config = super().engine_config(ctx, num_params)
        shards = ctx.shard_group or ctx.world_size
        config["zero_optimization"]["zero_hpz_partition_size"] = shards if shards < ctx.world_size else 1
        return config

    def communication(self, precision: str, backend: str) -> Communication:
        """deepspeed-zero3's, with backward's gathers within the shard group (``secondary_gather``)."""
        return replace(super().communication(precision, backend), secondary_gather=True)

    def model_state_shards(self, world_size: int, shard_group: int | None) -> int:
        """All N: hpZ's secondary partition lives within a step only."""
        return world_size
