"""``fsdp2-zero3``: FSDP2 with ``reshard_after_forward=True``: parameters are sharded too and
gathered per block when needed (ZeRO-3)."""

from bench.strategies.fsdp2_base import FSDP2Strategy


class FSDP2Zero3Strategy(FSDP2Strategy):
    name = "fsdp2-zero3"
    description = "peer: FSDP2 fully_shard, reshard_after_forward=True (ZeRO-3)"
    reshard_after_forward = True
    shards_parameters = True
