"""Bytes per network tier: the hierarchical model splits the flat ring's bytes, never changes them."""

from __future__ import annotations

import pytest

from shardbench.metrics.analytic import RING
from shardbench.metrics.topology import (
    TierBytes,
    check_ranks_per_node,
    node_shape,
    replica_group_ranks,
    shard_group_ranks,
    tier_bytes,
)

MIB = 1 << 20


@pytest.mark.parametrize("kind", sorted(RING))
@pytest.mark.parametrize(("world", "per_node"), [(4, 2), (8, 4), (64, 8), (6, 3), (16, 1), (8, 8)])
def test_the_tiers_add_up_to_the_flat_ring(kind: str, world: int, per_node: int) -> None:
    split = tier_bytes(kind, 3 * MIB, list(range(world)), per_node)
    assert split.total == pytest.approx(RING[kind](world) * 3 * MIB, rel=1e-12)


def test_a_group_inside_one_node_sends_nothing_across() -> None:
    assert tier_bytes("all_reduce", MIB, [4, 5, 6, 7], 8) == TierBytes(2 * 3 / 4 * MIB, 0.0)


def test_a_group_of_one_rank_per_node_sends_everything_across() -> None:
    assert tier_bytes("reduce_scatter", MIB, [1, 9, 17, 25], 8) == TierBytes(0.0, 3 / 4 * MIB)


def test_across_nodes_carries_a_per_node_slice() -> None:
    """64 ranks on 8 nodes: all-gather sends 7/8 of the tensor within the node and 7/8 of an
    eighth across (each of a node's 8 ranks takes its slice over the slow link)."""
    split = tier_bytes("all_gather", 8 * MIB, list(range(64)), 8)
    assert split.within_node == 7 / 8 * 8 * MIB
    assert split.across_nodes == 7 / 8 * MIB


def test_hybrid_groups_keep_the_shard_collectives_in_the_node() -> None:
    """N = 16, 8 a node: shard width 8 keeps the reduce-scatter within the node and puts only the
    replicas' all-reduce across; shard width 16 sends the reduce-scatter across."""
    narrow = tier_bytes("reduce_scatter", MIB, shard_group_ranks(3, 16, 8), 8)
    wide = tier_bytes("reduce_scatter", MIB, shard_group_ranks(3, 16, 16), 8)
    assert narrow.across_nodes == 0 and wide.across_nodes > 0
    replicas = replica_group_ranks(3, 16, 8)
    assert replicas == [3, 11] and node_shape(replicas, 8) == (1, 2)
    assert tier_bytes("all_reduce", MIB / 8, replicas, 8) == TierBytes(0.0, MIB / 8)


def test_unknown_kinds_send_nothing_counted() -> None:
    assert tier_bytes("barrier", MIB, [0, 1], 1).total == 0


@pytest.mark.parametrize("bad", [0, 3, 5, 2.0, True, "8"])
def test_ranks_per_node_that_do_not_fill_nodes_are_refused_in_one_line(bad: object) -> None:
    with pytest.raises(ValueError, match=r"ranks per node must divide .* 8 ranks .* allowed: 1, 2, 4, 8$"):
        check_ranks_per_node(bad, 8)


def test_predicted_tiers_of_hybrid_zero3_keep_the_shard_group_in_its_node() -> None:
    """zero3 at N = 4 on two nodes of 2: with S = 2 the gathers and the reduce-scatter stay in
    the node and only the replicas' all-reduce of a half crosses; with S = 4 the reduce-scatter
    and the gathers cross with half of every tensor (the model's factor: 2 ranks a node)."""
    from shardbench.metrics.analytic import CommShape, Communication, predicted_comm

    zero3 = Communication(
        gradients="reduce_scatter", gradient_bytes=4, parameters="all_gather", parameter_bytes=4, gathers=2
    )
    shape = CommShape(dims=((64, 64 * 64),))
    elements = 64 * 64
    narrow = predicted_comm(zero3, shape, 4, shard_size=2, ranks_per_node=2)
    wide = predicted_comm(zero3, shape, 4, shard_size=4, ranks_per_node=2)
    assert narrow["tiers"]["all_gather"]["across_nodes"] == 0
    assert narrow["tiers"]["reduce_scatter"]["across_nodes"] == 0
    assert narrow["tiers"]["all_reduce"] == {"within_node": 0, "across_nodes": 4 * elements // 2}
    assert wide["tiers"]["all_gather"]["across_nodes"] == round(1 / 2 * 2 * 4 * elements / 2)
    for out in (narrow, wide):  # the tiers split what the ring sends, never change it
        split = sum(t["within_node"] + t["across_nodes"] for t in out["tiers"].values())
        assert split == pytest.approx(out["sent_per_rank"], abs=3)


def _zero3_on_two_nodes(shard: int):
    from tests.cells import run_cell_here, tiny_cell

    record = run_cell_here(
        tiny_cell(strategy="zero3", world_size=4, shard_group=shard, ranks_per_node=2, simulate=True)
    )
    assert record.status == "ok", record.error
    return record


def _across(tiers: dict, kinds) -> int:
    return sum(tiers[k]["across_nodes"] for k in kinds)


def test_a_cells_bytes_per_tier_are_what_the_prediction_says() -> None:
    """zero3 at N = 4 on two nodes of 2 ranks (a simulated rank: the collectives it issues are
    counted on its fake group): within 1% per kind and tier for every kind predicted, and
    sharding within the node (S = 2) sends fewer bytes across nodes than over both (S = 4), by
    the factor the model says."""
    records = {shard: _zero3_on_two_nodes(shard) for shard in (2, 4)}
    for record in records.values():
        measured, predicted = record.comm_per_step["tiers"], record.predicted_comm["tiers"]
        assert record.comm_per_step["ranks_per_node"] == record.predicted_comm["ranks_per_node"] == 2
        for kind, tiers in predicted.items():
            for tier, sent in tiers.items():
                assert measured[kind][tier] == pytest.approx(sent, rel=0.01, abs=1024), (kind, tier)
    predicted = {s: r.predicted_comm["tiers"] for s, r in records.items()}
    measured = {s: r.comm_per_step["tiers"] for s, r in records.items()}
    factor = _across(predicted[2], predicted[2]) / _across(predicted[4], predicted[4])
    assert factor < 1
    measured_factor = _across(measured[2], predicted[2]) / _across(measured[4], predicted[4])
    assert measured_factor == pytest.approx(factor, rel=0.01)


#: what torchrun gives a process of a job of two nodes of two ranks
JOB_PROCESS = {"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "localhost", "LOCAL_WORLD_SIZE": "2"}


@pytest.mark.parametrize("asked", [None, 4])
def test_a_cells_ranks_are_given_the_node_size_the_command_reads(
    monkeypatch: pytest.MonkeyPatch, asked: int | None
) -> None:
    """The process that runs the command reads the job's node size (or the one asked) and hands it
    to the cell's ranks in their cell: a rank's own LOCAL_WORLD_SIZE counts the ranks sharing its
    cores (all four of a job's ranks on one host), which read as a node put every byte in it."""
    from shardbench.harness.launch import cell_for_ranks
    from tests.cells import tiny_cell

    for name, value in JOB_PROCESS.items():
        monkeypatch.setenv(name, value)
    cell = cell_for_ranks(tiny_cell(strategy="zero3", world_size=4, shard_group=2, ranks_per_node=asked))
    assert cell.ranks_per_node == (asked or 2)


def test_a_local_cell_measures_no_tiers_as_none_are_predicted() -> None:
    """On one machine, unasked, a cell is one node: its ranks' LOCAL_WORLD_SIZE (the launcher's,
    N) is no node size, so neither side splits bytes into tiers."""
    from shardbench.harness.launch import run_cell
    from tests.cells import tiny_cell

    record = run_cell(tiny_cell(strategy="zero2", steps=1, warmup=0), run_id="t")
    assert record.status == "ok", record.error
    assert "tiers" not in record.comm_per_step and "tiers" not in record.predicted_comm
