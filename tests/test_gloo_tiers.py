"""This machine's gloo in two tiers: the groups each tier probes at once, which probe costs a
collective over which group, and a real concurrent probe of two "nodes" of two ranks."""

from __future__ import annotations

import pytest

from shardbench.prediction.gloo_probe import probe, tier_groups
from shardbench.prediction.gloo_tiers import GlooTwoTier
from shardbench.prediction.network_profiles import LinkCost, NetworkProfile


def test_each_tier_probes_the_groups_a_hybrid_step_runs_at_once() -> None:
    assert tier_groups(8, 4, "within") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert tier_groups(8, 4, "across") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    with pytest.raises(ValueError, match="do not divide"):
        tier_groups(6, 4, "within")
    with pytest.raises(ValueError, match="tier must be one of within, across"):
        tier_groups(8, 4, "inside")


def _profile(name: str, latency_s: float) -> NetworkProfile:
    return NetworkProfile("gloo", LinkCost(latency_s, 1e9), name, shares_compute=True)


def test_a_collective_is_costed_by_the_probe_of_groups_shaped_like_its_own() -> None:
    tiers = GlooTwoTier(_profile("flat", 1.0), _profile("within", 10.0), _profile("across", 100.0), 2)
    # one call of no bytes: the latency says which probe priced it
    assert tiers.collective_seconds("all_reduce", 0, 1, (0, 1)) == 10.0  # a node
    assert tiers.collective_seconds("all_reduce", 0, 1, (2, 3)) == 10.0
    assert tiers.collective_seconds("all_reduce", 0, 1, (0, 2)) == 100.0  # one rank of each node
    assert tiers.collective_seconds("all_reduce", 0, 1, (0, 1, 2, 3)) == 1.0  # the whole world
    assert tiers.collective_seconds("all_reduce", 0, 1, (0,)) == 0.0
    assert tiers.shares_compute and tiers.name == "gloo"
    assert "within within; across across; spanning groups flat" in tiers.describe()


def test_a_concurrent_probe_fits_every_kind_over_its_group_size() -> None:
    got = probe(4, 1, tier_groups(4, 2, "within"), sizes=(1 << 10, 1 << 12, 1 << 14), in_step_steps=3)
    assert set(got["kinds"]) >= {"all_reduce", "all_gather", "broadcast"}
    for kind, fitted in got["kinds"].items():
        assert fitted["bandwidth"] > 0 and fitted["latency_s"] >= 0, kind
        assert len(fitted["points"]) == 3
    # a call's in-step cost: what the calls added to the steps, per call, beyond the cost the
    # fitted all-reduce line gives such a call
    s, line = got["in_step"], got["kinds"]["all_reduce"]
    assert s["compute_s"] > 0 and s["with_calls_s"] > 0
    ring = 2 * (1 / 2)  # an all-reduce over a group of 2 sends 2 (n-1)/n of the bytes
    assert s["aligned_call_s"] == pytest.approx(line["latency_s"] + ring * s["bytes"] / line["bandwidth"])
    beyond = (s["with_calls_s"] - s["compute_s"]) / s["calls"] - s["aligned_call_s"]
    assert s["seconds_per_call"] == max(0.0, beyond)
