"""A two-tier cluster network: a fast link inside each node of G ranks, a slower one across nodes.

A collective costs, per call, the latency of each tier it uses, plus what each tier carries
(``metrics.topology.tier_bytes``: the hierarchical model) over that tier's bandwidth per rank:

    calls * (latency_within [g > 1] + latency_across [k > 1])
      + bytes_within / bandwidth_within + bytes_across / bandwidth_across

where the group has g ranks on each of the k nodes it spans. The two tiers' parts run one after
the other (a hierarchical collective reduces inside the node before it crosses), so their times
add.

Named clusters are stated figures, each with its source; a user's own figures are given as
``intra=450GB/s:10us,inter=50GB/s:20us`` (bandwidth per rank one way, latency per call).

This module imports no torch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from shardbench.metrics.topology import node_shape, tier_bytes
from shardbench.prediction.network_profiles import GB, NAMED, LinkCost


@dataclass(frozen=True)
class ClusterNetwork:
    """Nodes of ``ranks_per_node`` ranks: ``within`` inside a node, ``across`` between nodes."""

    name: str
    within: LinkCost
    across: LinkCost
    ranks_per_node: int
    source: str
    #: a cluster's collectives run on their own links and engines, beside the compute
    shares_compute = False
    #: no in-step cost per call is stated for a named cluster (``NetworkProfile.in_step_call_s``)
    in_step_call_s = 0.0

    def collective_seconds(self, kind: str, nbytes: float, calls: int, group_ranks: Sequence[int]) -> float:
        """``calls`` collectives of ``kind`` moving ``nbytes`` of full tensors in all, over the
        group of ``group_ranks`` (global ranks, placed ``ranks_per_node`` to a node)."""
        if len(group_ranks) <= 1:
            return 0.0
        g, k = node_shape(group_ranks, self.ranks_per_node)
        split = tier_bytes(kind, nbytes, group_ranks, self.ranks_per_node)
        latency = (self.within.latency_s if g > 1 else 0.0) + (self.across.latency_s if k > 1 else 0.0)
        return (
            calls * latency
            + split.within_node / self.within.bandwidth
            + split.across_nodes / self.across.bandwidth
        )

    def with_ranks_per_node(self, ranks_per_node: int) -> ClusterNetwork:
        return ClusterNetwork(self.name, self.within, self.across, ranks_per_node, self.source)

    def describe(self) -> str:
        """One line: the cluster's shape, each tier's figures and their source."""
        return (
            f"{self.name}, {self.ranks_per_node} ranks a node: within "
            f"{_link_text(self.within)}, across {_link_text(self.across)} ({self.source})"
        )


def _link_text(link: LinkCost) -> str:
    return f"{link.bandwidth / GB:.3g} GB/s per rank, {link.latency_s * 1e6:.3g} µs per call"


#: Named clusters: NVLink inside a node of 8 GPUs, InfiniBand (one port per GPU) across.
CLUSTERS: dict[str, ClusterNetwork] = {
    "dgx-h100-ib400": ClusterNetwork(
        "dgx-h100-ib400",
        NAMED["nvlink"].default,
        NAMED["ib-400"].default,
        8,
        "DGX H100: NVLink 4 inside 8-GPU nodes (H100 SXM datasheet), InfiniBand NDR 400 Gb/s per GPU "
        "across; latencies assumed",
    ),
    "dgx-h100-ib200": ClusterNetwork(
        "dgx-h100-ib200",
        NAMED["nvlink"].default,
        NAMED["ib-200"].default,
        8,
        "H100 SXM nodes of 8 with NVLink 4 inside, InfiniBand HDR 200 Gb/s per GPU across; latencies "
        "assumed",
    ),
    "dgx-a100-ib200": ClusterNetwork(
        "dgx-a100-ib200",
        LinkCost(latency_s=10e-6, bandwidth=300 * GB),
        NAMED["ib-200"].default,
        8,
        "DGX A100: NVLink 3 inside 8-GPU nodes (A100 SXM datasheet, 600 GB/s both directions), "
        "InfiniBand HDR 200 Gb/s per GPU across; latencies assumed",
    ),
}

_RATE = {"GB/s": GB, "MB/s": 1e6, "Gb/s": GB / 8, "Mb/s": 1e6 / 8}
_TIME = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_LINK = re.compile(r"^(?P<bw>[0-9.]+)(?P<rate>GB/s|MB/s|Gb/s|Mb/s):(?P<lat>[0-9.]+)(?P<time>us|µs|ms|s)$")
CUSTOM_FORM = (
    "intra=<bandwidth>:<latency>,inter=<bandwidth>:<latency> (e.g. intra=450GB/s:10us,inter=50GB/s:20us)"
)


def is_custom(spec: str) -> bool:
    """Whether ``spec`` is meant as a user's own two tiers (rather than a profile's name)."""
    return "=" in spec


def parse_custom(spec: str, ranks_per_node: int) -> ClusterNetwork:
    """A user's own two tiers; ValueError in one line naming what is wrong and the form allowed."""
    links: dict[str, LinkCost] = {}
    for part in spec.split(","):
        tier, _, figures = part.strip().partition("=")
        found = _LINK.match(figures.strip())
        if tier not in ("intra", "inter") or tier in links or found is None:
            raise ValueError(f"network {spec!r}: cannot read {part.strip()!r}; allowed: {CUSTOM_FORM}")
        bandwidth = float(found["bw"]) * _RATE[found["rate"]]
        latency = float(found["lat"]) * _TIME[found["time"]]
        if bandwidth <= 0 or latency < 0:
            raise ValueError(f"network {spec!r}: a bandwidth must be above 0; allowed: {CUSTOM_FORM}")
        links[tier] = LinkCost(latency_s=latency, bandwidth=bandwidth)
    if set(links) != {"intra", "inter"}:
        raise ValueError(f"network {spec!r}: give both tiers; allowed: {CUSTOM_FORM}")
    given = "figures given by the user"
    return ClusterNetwork("custom", links["intra"], links["inter"], ranks_per_node, given)


#: what ``--network`` accepts, for a refusal
NETWORK_FORMS = (
    "a flat profile (gloo, nvlink, ib-200, ib-400), a cluster ("
    + ", ".join(CLUSTERS)
    + ") or intra=<bandwidth>:<latency>,inter=<bandwidth>:<latency>"
)


def cluster_network(name: str, ranks_per_node: int | None = None) -> ClusterNetwork | None:
    """The two-tier network ``name`` names (a cluster, with ``ranks_per_node`` in place of its
    nodes' size where given, or a user's own figures), or None for a flat profile's name."""
    if name in CLUSTERS:
        named = CLUSTERS[name]
        return named.with_ranks_per_node(ranks_per_node) if ranks_per_node else named
    if is_custom(name):
        if ranks_per_node is None:
            raise ValueError(f"network {name!r}: a network of two tiers needs --ranks-per-node")
        return parse_custom(name, ranks_per_node)
    return None


def check_any_network(name: str, ranks_per_node: int | None = None) -> str:
    """``name`` if it is a flat profile, a cluster or a readable pair of tiers; ValueError in one
    line naming what is allowed otherwise."""
    from shardbench.prediction.network_profiles import CHOICES

    if name in CHOICES or cluster_network(name, ranks_per_node or 1) is not None:
        return name
    raise ValueError(f"unknown network {name!r}; allowed: {NETWORK_FORMS}")
