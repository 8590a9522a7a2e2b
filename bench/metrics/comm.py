"""What a rank communicates in a step: every c10d collective it issues, counted as it is issued.

Collectives reach PyTorch's dispatcher as ``c10d`` operators (``allreduce_``,
``_allgather_base_``, ``_reduce_scatter_base_``, ``broadcast_``, ...), whoever calls them: our
sharded strategies, DDP's reducer in backward, ZeroRedundancyOptimizer, FSDP2. A
``TorchDispatchMode`` therefore sees them all, on gloo, nccl and the fake process group alike,
without changing what runs (it forwards every operator unchanged and allocates nothing), so a
simulated world of 1024 counts exactly what a real one would issue.

Per operator kind it records the calls, the bytes of the full tensor each call works on (an
all-reduce's tensor; an all-gather's output; a reduce-scatter's input; a broadcast's tensor) and
the bytes a ring algorithm sends per rank for it: all-reduce 2(N-1)/N x size, all-gather and
reduce-scatter (N-1)/N x the full size, broadcast and reduce (N-1)/N x size (a pipelined ring:
every rank but the last forwards the tensor once; per rank on average). Bytes are those of the tensors as
communicated (a bf16 bucket counts 2 bytes per element). N is the size of the group the
collective runs over: under hybrid sharding a rank's collectives run within its shard group and
across its replicas, and ``groups`` says what it sent in each (a group of consecutive ranks is
a shard group, one of ranks a stride apart its replica group).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from shardbench.metrics.analytic import RING
from shardbench.metrics.topology import NO_BYTES, TierBytes, tier_bytes, tiers_json
from shardbench.tensors import tensors_in

#: c10d operator -> (kind, which argument holds the full-size tensor(s))
_KINDS = {
    "allreduce_": ("all_reduce", 0),
    "allreduce_coalesced_": ("all_reduce", 0),
    "_allgather_base_": ("all_gather", 0),  # (output, input, ...): the output is the full size
    "allgather_": ("all_gather", 0),  # (output lists, inputs, ...)
    "allgather_into_tensor_coalesced_": ("all_gather", 0),
    "_reduce_scatter_base_": ("reduce_scatter", 1),  # (output, input, ...): the input is full
    "reduce_scatter_": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "broadcast_": ("broadcast", 0),
    "reduce_": ("reduce", 0),  # (FairScale's ShardedDataParallel: each gradient to its owner)
}


class CollectiveCounter(TorchDispatchMode):
    """Counts the collectives issued inside it (see the module docstring)."""

    def __init__(self, world_size: int, ranks_per_node: int | None = None) -> None:
        super().__init__()
        self.world_size = world_size
        self.ops: dict[str, dict[str, float]] = {}
        #: sent per rank in groups smaller than the world, by ``_group_kind``
        self.groups: dict[str, float] = {}
        #: with the ranks a node holds: what this rank sends within its node and across nodes,
        #: per kind (``topology.tier_bytes`` over the group each collective runs on)
        self.ranks_per_node = ranks_per_node
        self.tiers: dict[str, TierBytes] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func.namespace == "c10d":
            name = func._opname
            kind, index = _KINDS.get(name, (name.strip("_"), None))
            size = (
                sum(t.numel() * t.element_size() for t in tensors_in(args[index])) if index is not None else 0
            )
            entry = self.ops.setdefault(kind, {"calls": 0, "bytes": 0, "sent_per_rank": 0.0})
            entry["calls"] += 1
            entry["bytes"] += size
            if kind in RING:
                ranks = _group_ranks(args)
                sent = size * RING[kind](len(ranks) if ranks else self.world_size)
                entry["sent_per_rank"] += sent
                if ranks and 1 < len(ranks) < self.world_size:  # (a group of one sends nothing)
                    where = _group_kind(ranks)
                    self.groups[where] = self.groups.get(where, 0.0) + sent
                if self.ranks_per_node:
                    split = tier_bytes(kind, size, ranks or range(self.world_size), self.ranks_per_node)
                    self.tiers[kind] = self.tiers.get(kind, NO_BYTES) + split
        return func(*args, **(kwargs or {}))

    def summary(self) -> dict[str, Any]:
        """``{"world_size", "ops": {kind: {calls, bytes, sent_per_rank}}, "sent_per_rank"}``."""
        ops = {k: {**v, "sent_per_rank": round(v["sent_per_rank"])} for k, v in sorted(self.ops.items())}
        out: dict[str, Any] = {
            "world_size": self.world_size,
            "ops": ops,
            "sent_per_rank": sum(v["sent_per_rank"] for v in ops.values()),
        }
        if self.groups:
            out["groups"] = {k: round(v) for k, v in sorted(self.groups.items())}
        if self.ranks_per_node:
            out["ranks_per_node"] = self.ranks_per_node
            out["tiers"] = tiers_json(self.tiers)
        return out


def _group_ranks(args: tuple) -> list[int] | None:
    """The global ranks of the process group a c10d operator runs over (None: not found)."""
    for a in args:
        if isinstance(a, torch.ScriptObject) and "ProcessGroup" in str(a._type()):
            try:
                return dist.get_process_group_ranks(dist.ProcessGroup.unbox(a))
            except (RuntimeError, ValueError):
                return None
    return None


def _group_kind(ranks: list[int]) -> str:
    """A group of consecutive ranks is a shard group ("shard"), one of ranks a stride apart a
    replica group ("replicate")."""
    ordered = sorted(ranks)
    return "shard" if ordered[-1] - ordered[0] == len(ordered) - 1 else "replicate"
