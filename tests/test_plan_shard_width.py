"""``plan`` over a cluster of nodes: every shard width worth planning for each strategy that
shards in groups, each collective priced on the tiers it crosses, and the width it recommends
with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardbench.cli import main
from shardbench.harness import runner
from shardbench.studies.plan import planning_cells, shard_widths
from tests.cells import measured_once

#: the tiny transformer on 4 ranks, two nodes of 2 (a user's own tiers: a slow link across)
ARGS = ["plan", "--workload", "transformer", "--preset", "tiny", "--world-size", "4", "--budget", "1GiB"]
TIERS = ["--network", "intra=100GB/s:5us,inter=1GB/s:50us", "--ranks-per-node", "2"]


@pytest.mark.parametrize(
    ("world", "per_node", "widths"),
    [
        (64, 8, [4, 8, 16, 32, 64]),
        (16, 8, [4, 8, 16]),
        (12, 4, [2, 4, 12]),
        (8, 1, [2, 4, 8]),
        (4, 2, [2, 4]),
    ],
)
def test_the_widths_are_whole_nodes_or_half_of_one(world: int, per_node: int, widths: list[int]) -> None:
    assert shard_widths(world, per_node) == widths


def test_only_strategies_that_shard_in_groups_get_a_cell_per_width() -> None:
    cells = planning_cells(
        workload="transformer", preset="tiny", world_size=8, batch_size=2, device="cpu", fake=True,
        strategies=("ddp", "zero3", "fsdp2-zero3"), shard_widths=(2, 4, 8),
    )  # fmt: skip
    assert [(c.strategy, c.shard_group) for c in cells] == [
        ("ddp", None), ("zero3", None), ("zero3", 2), ("zero3", 4), ("fsdp2-zero3", None),
    ]  # fmt: skip


def test_a_plan_over_two_tiers_prefers_the_width_that_stays_in_the_node(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    """zero3 sharded within a node (S = 2) sends nothing over the slow link but the replicas'
    average, so it is predicted faster than zero3 over all 4, and recommended with why."""
    monkeypatch.setattr(runner, "run_cell", measured_once())
    out = tmp_path / "plan"
    on_h100 = ["--strategy", "zero3", "--device", "cuda", "--gpu", "H100"]
    assert main([*ARGS, *TIERS, *on_h100, "--out", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    rows = {(r["strategy"], r["shard_group"]): r for r in plan["rows"]}
    assert set(rows) == {("zero3", 4), ("zero3", 2)}
    narrow, wide = (rows[("zero3", s)]["predicted_step_time"] for s in (2, 4))
    assert narrow["exposed_comm"] < wide["exposed_comm"]
    assert plan["recommended"] == "zero3 S=2"
    stays = "shard width: zero3 S=2: every gather and reduce-scatter stays in the node"
    assert plan["shard_width"].startswith(stays)
    assert "predicted" in plan["shard_width"] and "x as fast as zero3 S=4 " in plan["shard_width"]
    assert (out / "shard-widths.png").is_file() and (out / "shard-widths.svg").is_file()
    assert "](shard-widths.png)" in (out / "plan.md").read_text()
    printed = capsys.readouterr().out
    assert "zero3 S=2" in printed and "shard width: zero3 S=2" in " ".join(printed.split())


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--ranks-per-node", "3"], "of 4 ranks into full nodes, got 3; allowed: 1, 2, 4"),
        (["--network", "fast"], "unknown network 'fast'; allowed: a flat profile (gloo, nvlink"),
        (["--network", TIERS[1]], "a network of two tiers needs --ranks-per-node"),
        (["--network", "intra=100GB/s,inter=1GB/s:50us", *TIERS[2:]], "cannot read 'intra=100GB/s'"),
        (["--shard-group", "3"], "--shard-group 3: each width must divide the world of 4 ranks; allowed: 1,"),
        (["--shard-group", "2", "--strategy", "ddp"], "--shard-group: none of ddp shards in groups"),
    ],
)  # fmt: skip
def test_a_cluster_shape_that_does_not_fit_is_refused_in_one_line(
    argv: list[str], needle: str, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "o"
    assert main([*ARGS, *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not out.exists()
