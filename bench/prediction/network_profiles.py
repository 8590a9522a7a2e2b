"""Network profiles: what one collective costs, for the step-time model
(``bench/prediction/step_time.py``).

A collective of ``bytes`` (the full tensor, as ``metrics.analytic.predicted_comm`` and
``metrics.comm`` count it) issued in ``calls`` calls on ``n`` ranks costs, by the standard ring
model,

    calls * latency + RING[kind](n) * bytes / bandwidth

(all-reduce sends ``2 (n-1)/n`` of the bytes per rank, all-gather, reduce-scatter, broadcast
and reduce ``(n-1)/n``, as does a reduce of each chunk to its owner). ``bandwidth`` is what one rank
sends per second, one direction.

Named profiles are stated figures, not measurements: where each comes from is beside it. The
``gloo`` profile is measured on this machine at the run's world size (``gloo_probe``) and has a
latency and a bandwidth per collective kind: gloo's algorithms differ by kind.

On a CPU the ranks' collectives run on the same cores as their compute (gloo's threads take a
core from the math), so the ``gloo`` profile says ``shares_compute``: the model counts its
communication as exposed, whatever would overlap on a GPU. It also says what each call costs
inside a step beyond its barrier-aligned time (``in_step_call_s``: the wait for the last rank to
arrive, the group's threads winning a core back), measured with it.

This module imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from shardbench.metrics.analytic import RING

GB = 1e9


@dataclass(frozen=True)
class LinkCost:
    """One kind of collective's cost: seconds per call and bytes per second sent per rank."""

    latency_s: float
    bandwidth: float  # bytes per second, per rank, one direction

    def seconds(self, kind: str, nbytes: float, calls: int, world_size: int) -> float:
        """``calls`` calls moving ``nbytes`` of full tensors in all, on a ring of ``world_size``."""
        if world_size <= 1:
            return 0.0
        return calls * self.latency_s + RING[kind](world_size) * nbytes / self.bandwidth


@dataclass(frozen=True)
class NetworkProfile:
    """A network as the model sees it: a default cost, per-kind costs where measured, whether
    its communication shares the cores with compute, and where its figures come from."""

    name: str
    default: LinkCost
    source: str
    by_kind: dict[str, LinkCost] = field(default_factory=dict)
    #: collectives run on the compute's own cores (gloo on a CPU): nothing overlaps
    shares_compute: bool = False
    #: seconds each call costs inside a step beyond its barrier-aligned time, where measured
    #: (``gloo_probe.in_step``); the named links state none
    in_step_call_s: float = 0.0

    def cost(self, kind: str) -> LinkCost:
        return self.by_kind.get(kind, self.default)

    def seconds(self, kind: str, nbytes: float, calls: int, world_size: int) -> float:
        return self.cost(kind).seconds(kind, nbytes, calls, world_size)

    def collective_seconds(self, kind: str, nbytes: float, calls: int, group_ranks: Sequence[int]) -> float:
        """The same over the ring of ``group_ranks`` (one flat link: only their number counts)."""
        return self.seconds(kind, nbytes, calls, len(group_ranks))

    def describe(self) -> str:
        """One line: the profile's name, its figures and their source."""
        d = self.default
        return (
            f"network {self.name}: {d.bandwidth / GB:.3g} GB/s per rank, {d.latency_s * 1e6:.3g} µs "
            f"per call ({self.source})"
        )


#: Stated figures for GPUs. Bandwidths are the links' line rates, one direction; latencies are
#: an assumed per-call cost of the order NCCL reaches on such a link (tens of µs across
#: nodes, a few within one), not a measurement: a model of a cluster, to be replaced by a
#: measured profile where one exists.
NAMED: dict[str, NetworkProfile] = {
    # NVIDIA H100 SXM datasheet: NVLink 900 GB/s per GPU, both directions together (450 one way)
    "nvlink": NetworkProfile(
        "nvlink",
        LinkCost(latency_s=10e-6, bandwidth=450 * GB),
        "NVLink 4 within a node: H100 SXM datasheet, 900 GB/s both directions; latency assumed",
    ),
    # InfiniBand HDR: 200 Gb/s per port = 25 GB/s one way, one port per GPU across nodes
    "ib-200": NetworkProfile(
        "ib-200",
        LinkCost(latency_s=20e-6, bandwidth=25 * GB),
        "InfiniBand HDR across nodes, 200 Gb/s per GPU (one port each); latency assumed",
    ),
    # InfiniBand NDR: 400 Gb/s per port = 50 GB/s one way, one port per GPU across nodes
    "ib-400": NetworkProfile(
        "ib-400",
        LinkCost(latency_s=20e-6, bandwidth=50 * GB),
        "InfiniBand NDR across nodes, 400 Gb/s per GPU (one port each); latency assumed",
    ),
}
#: the profile measured on this machine (``gloo_probe``)
MEASURED = "gloo"
CHOICES = (MEASURED, *NAMED)


def default_network(device: str) -> str:
    """What ``--network`` is when not given: gloo measured here on a CPU, NVLink on CUDA."""
    return MEASURED if device == "cpu" else "nvlink"

