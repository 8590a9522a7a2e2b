"""This machine's gloo network in two tiers, for a run whose ranks are placed ``ranks_per_node``
to a "node" (``run --ranks-per-node``, or a job's local world size).

A collective is costed by the group it runs over (``metrics.topology.node_shape``):

- a group inside one node: the ``within`` probe, the nodes' groups running at once;
- a group of one rank per node: the ``across`` probe, those groups running at once;
- any other group (the whole world of a flat strategy): the flat probe at its size, today's.

The concurrent probes (``gloo_probe``, ``groups``) matter on a CPU: a hybrid-sharded step runs
every shard group's reduce-scatter, or every replica group's all-reduce, at the same moment on
the same cores, which a lone probe at the group's size would not see.

This module imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardbench.metrics.topology import node_shape
from shardbench.prediction.network_profiles import MEASURED, NetworkProfile


@dataclass(frozen=True)
class GlooTwoTier:
    """The flat gloo profile at the run's world size, and the two tiers' concurrent probes."""

    flat: NetworkProfile
    within: NetworkProfile
    across: NetworkProfile
    ranks_per_node: int
    name = MEASURED
    #: gloo's threads take cores from the math: every collective is exposed
    shares_compute = True

    def collective_seconds(self, kind: str, nbytes: float, calls: int, group_ranks: Sequence[int]) -> float:
        """``calls`` collectives of ``kind`` moving ``nbytes`` of full tensors over the group of
        ``group_ranks``, costed by the probe of the groups shaped like it."""
        if len(group_ranks) <= 1:
            return 0.0
        per_node, nodes = node_shape(group_ranks, self.ranks_per_node)
        if nodes == 1:
            return self.within.seconds(kind, nbytes, calls, len(group_ranks))
        if per_node == 1 and len(group_ranks) == nodes:
            return self.across.seconds(kind, nbytes, calls, len(group_ranks))
        return self.flat.collective_seconds(kind, nbytes, calls, group_ranks)

    @property
    def in_step_call_s(self) -> float:
        """What a call costs inside a step beyond its aligned time: the flat probe's."""
        return self.flat.in_step_call_s

    @property
    def source(self) -> str:
        return (
            f"gloo in two tiers, {self.ranks_per_node} ranks a node: within {self.within.source}; "
            f"across {self.across.source}; spanning groups {self.flat.source}"
        )

    def describe(self) -> str:
        return self.source
