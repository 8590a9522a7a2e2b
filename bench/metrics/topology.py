"""Where a collective's bytes travel on a cluster of nodes: within a node, or across nodes.

A cluster has two tiers: a fast link inside a node (NVLink, or a machine's own memory) and a
slower one between nodes (InfiniBand, Ethernet). Ranks are placed in order, ``ranks_per_node``
(G) to a node, as torchrun and Slurm place them: rank r lives on node r // G.

A collective over a group spanning k nodes with g of its ranks on each is modelled the standard
hierarchical way, as NCCL's tree and ring-of-rings algorithms and DeepSpeed's hierarchical
collectives run it: the work inside each node as a ring over its g ranks, and across nodes a
ring over the k nodes carrying only 1/g of the bytes (each of a node's g ranks takes its slice
across). Per rank of the group, of a full tensor of M bytes:

    kind                         within a node        across nodes
    all-reduce                   2 (g-1)/g  M         2 (k-1)/k  M/g
    all-gather, reduce-scatter   (g-1)/g  M           (k-1)/k  M/g
    broadcast, reduce            (g-1)/g  M           (k-1)/k  M/g

The two add up to the flat ring's figure for n = g k ranks (``ring_factor``, which
``analytic.RING`` is): the hierarchy moves the same bytes, it only decides which link carries
them. A group whose ranks are spread
unevenly over nodes (possible only for a user's own groups) is counted with g its smallest
per-node share, which bounds what crosses from above.

This module imports no torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

#: the passes of a full tensor a ring makes per kind: a reduction or a spreading is one (each
#: member sends (n-1)/n of the tensor), an all-reduce both (a reduce-scatter, then an all-gather);
#: a broadcast or reduce is a pipelined ring, each member but the last forwarding it once; a reduce
#: of each of the tensor's n chunks to its own owner (our ZeRO's reducer on gloo) has each member
#: send every chunk but its own once
PASSES = {
    "all_reduce": 2,
    "all_gather": 1,
    "reduce_scatter": 1,
    "broadcast": 1,
    "reduce": 1,
    "reduce_to_owners": 1,
}


def ring_factor(kind: str, n: int) -> float:
    """The fraction of a full tensor's bytes each of n ranks sends for one ``kind`` collective."""
    return PASSES[kind] * (n - 1) / n


@dataclass(frozen=True)
class TierBytes:
    """Bytes one rank sends for a collective, by the link that carries them."""

    within_node: float
    across_nodes: float

    @property
    def total(self) -> float:
        return self.within_node + self.across_nodes

    def __add__(self, other: TierBytes) -> TierBytes:
        return TierBytes(self.within_node + other.within_node, self.across_nodes + other.across_nodes)


NO_BYTES = TierBytes(0.0, 0.0)


def tiers_json(tiers: dict[str, TierBytes]) -> dict[str, dict[str, int]]:
    """Per kind, the bytes sent within a node and across nodes, as a record holds them."""
    return {
        kind: {"within_node": round(t.within_node), "across_nodes": round(t.across_nodes)}
        for kind, t in sorted(tiers.items())
    }


def divisors(n: int) -> list[int]:
    """The whole numbers that divide ``n``: the shard widths and node sizes a world of n allows."""
    return [d for d in range(1, n + 1) if n % d == 0]


def check_ranks_per_node(ranks_per_node: object, world_size: int) -> None:
    """ValueError in one line unless ``ranks_per_node`` is a whole number of ranks that fills
    the world's nodes evenly (a divisor of the world size, or the world size itself)."""
    allowed = divisors(world_size)
    whole = isinstance(ranks_per_node, int) and not isinstance(ranks_per_node, bool)
    if not whole or ranks_per_node not in allowed:
        raise ValueError(
            f"ranks per node must divide the world of {world_size} ranks into full nodes, got "
            f"{ranks_per_node!r}; allowed: {', '.join(map(str, allowed))}"
        )


def node_shape(group_ranks: Sequence[int], ranks_per_node: int) -> tuple[int, int]:
    """(g, k): the group's ranks per node (its smallest share on any node it uses) and the
    number of nodes it spans."""
    if not group_ranks:
        raise ValueError("a collective's group has at least one rank")
    per_node = Counter(r // ranks_per_node for r in group_ranks)
    return min(per_node.values()), len(per_node)


def tier_bytes(kind: str, nbytes: float, group_ranks: Sequence[int], ranks_per_node: int) -> TierBytes:
    """What each rank of ``group_ranks`` sends, per tier, for one ``kind`` collective on a full
    tensor of ``nbytes`` (see the module docstring). Kinds without a ring model send nothing
    counted, as in ``analytic.RING``."""
    if kind not in PASSES:
        return NO_BYTES
    n = len(group_ranks)
    if n <= 1:
        return NO_BYTES
    g, k = node_shape(group_ranks, ranks_per_node)
    if g * k != n:  # uneven: the flat figure, split as if g ranks a node carried it
        flat = ring_factor(kind, n) * nbytes
        across = PASSES[kind] * (k - 1) / k * nbytes / g
        return TierBytes(flat - across, across)
    within = PASSES[kind] * (g - 1) / g * nbytes
    across = PASSES[kind] * (k - 1) / k * nbytes / g
    return TierBytes(within, across)


def shard_group_ranks(rank: int, world_size: int, shard_size: int) -> list[int]:
    """The ranks ``rank`` shards with under hybrid sharding: S consecutive ranks."""
    start = rank // shard_size * shard_size
    return list(range(start, start + shard_size))


def replica_group_ranks(rank: int, world_size: int, shard_size: int) -> list[int]:
    """The ranks holding the same chunk as ``rank`` in the other shard groups."""
    return list(range(rank % shard_size, world_size, shard_size))
