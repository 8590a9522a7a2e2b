"""``fsdp2-hsdp``: FSDP2's hybrid sharding (HSDP), ``fully_shard`` over a 2D device mesh of
N/S replicas x S shards.

Configured as the FSDP2 documentation describes HSDP ("a 2D DeviceMesh ... replicate on the
0th dim and shard on the 1st dim") and as torchtitan builds it (``dp_replicate`` x
``dp_shard``): ``init_device_mesh(device, (N // S, S), mesh_dim_names=("replicate", "shard"))``
and ``fully_shard(module, mesh=mesh)``, with everything else as ``fsdp2-zero3`` (the same units,
mixed-precision policy and ``reshard_after_forward=True``, HSDP's default). Each rank keeps 1/S
of the parameters, gradients and optimizer state; a step all-gathers each unit within its
shard group, reduce-scatters the gradients there, then all-reduces its gradient shard across
the N/S replicas. Without a shard width (S = N) the mesh has one replica: FSDP2 as fsdp2-zero3.
"""

from __future__ import annotations

from typing import Any

from shardbench.strategies.base import RankContext
from shardbench.strategies.fsdp2 import FSDP2Zero3Strategy, _fsdp_api

MESH_DIMS = ("replicate", "shard")


class FSDP2HSDPStrategy(FSDP2Zero3Strategy, card="fsdp2-hsdp"):
    def __init__(self) -> None:
        super().__init__()
        self.shape: tuple[int, int] | None = None

    def init_world(self, ctx: RankContext) -> None:
        """The 2D mesh: N/S replicas (dim 0) of S shards (dim 1), each shard group S
        consecutive ranks, as torchtitan lays out ``dp_replicate`` x ``dp_shard``."""
        init_device_mesh = _fsdp_api()[0]
        shard = ctx.shard_group or ctx.world_size
        self.shape = (ctx.world_size // shard, shard)
        self.mesh = init_device_mesh(ctx.device.type, self.shape, mesh_dim_names=MESH_DIMS)

    def settings(self) -> dict[str, Any]:
        mesh = dict(zip(MESH_DIMS, self.shape, strict=True)) if self.shape is not None else None
        return {**super().settings(), "mesh": mesh}
