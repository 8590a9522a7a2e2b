"""The two-tier network: each tier's bytes over its own link, a user's own figures read or refused."""

from __future__ import annotations

import pytest

from shardbench.metrics.topology import replica_group_ranks, shard_group_ranks
from shardbench.prediction.cluster_network import CLUSTERS, is_custom, parse_custom
from shardbench.prediction.network_profiles import GB

DGX = CLUSTERS["dgx-h100-ib400"]


def test_a_collective_inside_a_node_costs_the_fast_link_only() -> None:
    """8 ranks of one node all-reduce 1 GB: 2 * 7/8 GB over NVLink's 450 GB/s, one latency."""
    seconds = DGX.collective_seconds("all_reduce", 1 * GB, 1, list(range(8)))
    assert seconds == pytest.approx(10e-6 + 2 * 7 / 8 * GB / (450 * GB))


def test_a_collective_across_nodes_adds_the_slow_tier() -> None:
    """64 ranks, 8 a node: NVLink carries 2 * 7/8 of the bytes, InfiniBand 2 * 7/8 of an eighth."""
    seconds = DGX.collective_seconds("all_reduce", 1 * GB, 1, list(range(64)))
    expected = 30e-6 + 2 * 7 / 8 * GB / (450 * GB) + 2 * 7 / 8 * GB / 8 / (50 * GB)
    assert seconds == pytest.approx(expected)


def test_sharding_within_the_node_moves_the_gathers_off_the_slow_link() -> None:
    """zero3 at N = 64: an all-gather over S = 8 (one node) is faster than over S = 64."""
    narrow = DGX.collective_seconds("all_gather", 1 * GB, 1, shard_group_ranks(0, 64, 8))
    wide = DGX.collective_seconds("all_gather", 1 * GB, 1, shard_group_ranks(0, 64, 64))
    assert narrow < wide
    replicas = DGX.collective_seconds("all_reduce", GB / 8, 1, replica_group_ranks(0, 64, 8))
    assert replicas == pytest.approx(20e-6 + 2 * 7 / 8 * GB / 8 / (50 * GB))


def test_one_rank_costs_nothing() -> None:
    assert DGX.collective_seconds("all_reduce", GB, 3, [5]) == 0.0


def test_a_users_own_tiers_are_read() -> None:
    spec = "intra=450GB/s:10us,inter=400Gb/s:20us"
    assert is_custom(spec) and not is_custom("dgx-h100-ib400")
    net = parse_custom(spec, 4)
    assert net.within.bandwidth == 450 * GB and net.across.bandwidth == 50 * GB
    assert net.within.latency_s == pytest.approx(10e-6) and net.across.latency_s == pytest.approx(20e-6)
    assert net.ranks_per_node == 4 and "4 ranks a node" in net.describe()


@pytest.mark.parametrize(
    "spec", ["intra=450GB/s:10us", "intra=450:10us,inter=50GB/s:20us", "intra=450GB/s:10us,intra=1GB/s:1us",
             "fast=1GB/s:1us,inter=1GB/s:1us", "intra=0GB/s:1us,inter=1GB/s:1us"],
)  # fmt: skip
def test_unreadable_tiers_are_refused_in_one_line_naming_the_form(spec: str) -> None:
    with pytest.raises(ValueError, match=r"^network .*allowed: intra=<bandwidth>:<latency>") as err:
        parse_custom(spec, 8)
    assert "\n" not in str(err.value)


def _zero3_step(shard: int, network) -> float:
    """zero3's exposed communication at N = 16 over ``network`` with shard width ``shard``."""
    from shardbench.metrics.analytic import CommShape, Communication, comm_sends
    from shardbench.prediction.step_time import Collective, StepInputs, predict_step

    zero3 = Communication(
        gradients="reduce_scatter", gradient_bytes=2, parameters="all_gather", parameter_bytes=2, gathers=2
    )
    sends = comm_sends(zero3, CommShape(dims=((4096, 1 << 30),)), 16, shard)
    calls = tuple(
        Collective(s.kind, s.nbytes, 32, "other", tuple(s.group_ranks(16, shard))) for s in sends
    )
    inputs = StepInputs(flops=1e15, rate=1e15, collectives=calls, world_size=16)
    return predict_step(inputs, network)["exposed_comm"]


def test_a_cluster_prices_each_group_on_its_tiers() -> None:
    """16 ranks, 8 a node: sharding within the node (S = 8) keeps the gathers on NVLink and costs
    less than sharding across both nodes (S = 16), by what InfiniBand carries."""
    assert _zero3_step(8, DGX) < _zero3_step(16, DGX)


def test_a_flat_profile_prices_a_group_by_its_own_ring() -> None:
    from shardbench.prediction.network_profiles import NAMED

    flat = NAMED["ib-400"]
    pair = flat.collective_seconds("reduce_scatter", GB, 1, [0, 1])
    assert pair == flat.seconds("reduce_scatter", GB, 1, 2) < flat.seconds("reduce_scatter", GB, 1, 16)
