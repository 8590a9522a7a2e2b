"""``fsdp2-zero2``: FSDP2 with ``reshard_after_forward=False``: parameters stay unsharded from
forward to backward, so, like ZeRO-2, steady-state sharding is optimizer state and gradients."""

from bench.strategies.fsdp2_base import FSDP2Strategy


class FSDP2Zero2Strategy(FSDP2Strategy):
    name = "fsdp2-zero2"
    description = "peer: FSDP2 fully_shard, reshard_after_forward=False (ZeRO-2-like)"
    reshard_after_forward = False
