"""The shard width S as a cell axis: suites and ``run --shard-group`` cross it with the other
axes, a strategy that takes none runs once flat, an S that fits no cell is refused in one line;
records state S and a flat one is the cell an old record (no S) was; model states follow the
formula with S in place of N to the byte, and the bytes sent within the shard group and across
replicas are what the accounting predicts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardbench.harness.config import load_suite
from shardbench.harness.shard_width import fit_shard_groups
from shardbench.models.registry import get_workload
from shardbench.records import CellKey, Record, strategy_label
from shardbench.studies.compare import cell_label, compare_runs
from shardbench.studies.export import benchmark_name
from tests.cells import run_cell_here, tiny_cell


def test_a_suite_crosses_the_shard_width_with_the_other_axes(tmp_path) -> None:
    path = tmp_path / "hybrid.toml"
    path.write_text('strategies = ["ddp", "zero2"]\nworld_sizes = [2, 4]\nshard_group = [2, 4]\n')
    cells, lines = fit_shard_groups(load_suite(str(path)).cells())
    got = [(c.strategy, c.world_size, c.shard_group) for c in cells]
    assert got == [("ddp", 2, None), ("ddp", 4, None), ("zero2", 2, 2), ("zero2", 4, 2), ("zero2", 4, 4)]
    assert lines == [
        "shard group: ddp does not shard in groups; its cells run once, over all ranks",
        "shard group 4 does not divide world size 2: those cells skipped",
    ]


def test_no_shard_width_is_n_for_a_strategy_that_takes_one() -> None:
    cells, lines = fit_shard_groups([tiny_cell(strategy="zero3", world_size=4), tiny_cell()])
    assert [c.shard_group for c in cells] == [4, None] and lines == []


@pytest.mark.parametrize(
    ("cells", "message"),
    [
        (
            [tiny_cell(strategy="zero2", world_size=4, shard_group=3)],
            "shard group 3 divides no world size of a strategy that shards in groups (4); allowed: 1, 2, 4",
        ),
        (
            [tiny_cell(strategy="ddp", world_size=4, shard_group=2)],
            "shard group 2: ddp does not shard in groups; allowed: zero1, zero2, zero3",
        ),
        (
            [tiny_cell(strategy="zero2", shard_group=0)],
            "shard group must be a whole number of ranks >= 1, got 0",
        ),
    ],
)
def test_a_shard_width_that_fits_no_cell_is_refused(cells, message: str) -> None:
    with pytest.raises(ValueError) as e:
        fit_shard_groups(cells)
    assert str(e.value).startswith(message)


def _record(**fields) -> Record:
    base = dict(
        run_id="r", suite="s", workload="transformer", preset="tiny", params=1, strategy="zero3",
        world_size=4, requested_world_size=4, simulated=False, backend="gloo", device="cpu",
        precision="fp32", batch_size_per_rank=2, steps=1, warmup=0, status="ok",
    )  # fmt: skip
    return Record(**{**base, **fields})


def test_the_shard_width_is_part_of_a_cells_identity() -> None:
    old = Record.from_json({k: v for k, v in _record().to_json().items() if k != "shard_group"})
    flat, hybrid = _record(shard_group=4), _record(shard_group=2)
    assert CellKey.of(old) == CellKey.of(flat) != CellKey.of(hybrid)
    assert CellKey.of(hybrid).without("strategy") == CellKey.of(_record(strategy="ddp")).without("strategy")
    assert cell_label(CellKey.of(hybrid)) == "transformer/tiny/zero3/n4/s2/fp32/b2/cpu"
    assert cell_label(CellKey.of(old)) == "transformer/tiny/zero3/n4/fp32/b2/cpu"
    assert [strategy_label(r) for r in (old, flat, hybrid)] == ["zero3", "zero3", "zero3 S=2"]
    names = [benchmark_name(r) for r in (old, flat, hybrid)]
    assert names == [*["transformer/tiny/zero3/n4/fp32/b2"] * 2, "transformer/tiny/zero3/n4/s2/fp32/b2"]
    cell = tiny_cell(strategy="zero3", world_size=4)
    assert replace(cell, shard_group=4).key() == cell.key() != replace(cell, shard_group=2).key()


@pytest.mark.parametrize(("world", "shard"), [(4, 2), (8, 4)])
@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3", "fsdp2-hsdp"])
def test_hybrid_model_states_and_bytes_sent_follow_the_formula_with_s(
    strategy: str, world: int, shard: int
) -> None:
    """A simulated cell at N = 4, S = 2 and at N = 8, S = 4 (our ZeRO, FSDP2's HSDP): parameters
    and gradients to the byte (the tiny transformer's buckets, and its parameters' dim 0, split
    evenly in S), the optimizer's state to the byte once AdamW's 4-byte step counters (which the
    formula leaves out) are set aside; what a rank sends within its shard group and across
    replicas to the byte."""
    cell = tiny_cell(strategy=strategy, world_size=world, simulate=True, shard_group=shard)
    record = run_cell_here(cell)
    assert record.status == "ok", record.error
    assert record.shard_group == shard
    held, predicted = record.model_state_bytes, record.predicted_mem_bytes
    psi = record.params
    sharded = {"zero1": ("optimizer",), "zero2": ("optimizer", "grads")}.get(
        strategy, ("optimizer", "grads", "params")
    )
    assert predicted == {
        "params": 4 * psi // (shard if "params" in sharded else 1),
        "grads": 4 * psi // (shard if "grads" in sharded else 1),
        "optimizer": 8 * psi // shard,
        "total": predicted["params"] + predicted["grads"] + predicted["optimizer"],
    }
    tensors = len(list(get_workload("transformer").build("tiny").parameters()))
    for part in ("params", "grads", "optimizer"):
        padding = held[part] - predicted[part]
        if shard == 2 and part != "optimizer":
            assert padding == 0, part
        assert 0 <= padding <= 0.001 * predicted[part] + 4 * tensors, part  # 4 * tensors: step counters
    if shard == 2:
        assert (held["optimizer"] - predicted["optimizer"]) % 4 == 0
    sent, expected = record.comm_per_step, record.predicted_comm
    for group, bytes_sent in expected["groups"].items():
        assert bytes_sent <= sent["groups"][group] <= 1.001 * bytes_sent, group
    if shard == 2:
        assert sent["groups"] == expected["groups"]
    replicas = world // shard  # each chunk (1/S) all-reduced over them
    chunk = 4 * psi / shard * 2 * (replicas - 1) / replicas
    assert expected["groups"]["replicate"] == pytest.approx(chunk, rel=0 if shard == 2 else 1e-3)


def test_compare_matches_old_flat_records_and_keeps_hybrid_cells_apart() -> None:
    """A baseline written before the field (no S) compares with today's flat cell; a hybrid
    cell is a cell of its own, new to that baseline, and regresses against its own kind."""
    from tests.test_compare import GIB, rec

    old = rec(strategy="zero2")
    old_json = {k: v for k, v in old.to_json().items() if k != "shard_group"}
    baseline = [Record.from_json(old_json)]
    flat, hybrid = rec(strategy="zero2", shard_group=2), rec(strategy="zero2", shard_group=1)
    got = {c.cell: c.verdict for c in compare_runs(baseline, [flat, hybrid]).cells}
    assert got == {
        "transformer/tiny/zero2/n2/fp32/b8/cpu": "unchanged",
        "transformer/tiny/zero2/n2/s1/fp32/b8/cpu": "new",
    }
    worse = rec(strategy="zero2", shard_group=1, peak_mem_bytes={"max": 2 * GIB, "per_rank": [2 * GIB] * 2})
    assert compare_runs([hybrid], [worse]).exit_code == 1


def test_charts_put_a_hybrid_cell_beside_its_flat_one() -> None:
    """One group for the cell, a bar for each shard width: the hybrid one hatched in its
    strategy's colour, so the two read as one strategy at two widths."""
    from shardbench.report.chart_types import group_labels
    from shardbench.report.styles import hatch, strategy_color

    records = [_record(shard_group=4), _record(shard_group=2)]
    assert len(set(group_labels(records))) == 1
    assert strategy_color("zero3 S=2") == strategy_color("zero3")
    assert (hatch("zero3"), hatch("zero3 S=2")) == (None, "//")


def test_the_tables_tell_a_hybrid_cell_from_its_flat_one() -> None:
    """table.md and table.csv (``records_to_frame``) carry S where a run has a hybrid cell; a
    run without one keeps its columns as they were."""
    from shardbench.report.tables import records_to_frame
    from tests.records import make_record

    flat = make_record(strategy="zero3", world_size=4, shard_group=4)
    hybrid = make_record(strategy="zero3", world_size=4, shard_group=2)
    frame = records_to_frame([flat, hybrid])
    shown = frame["shard_group"].tolist()
    assert 2 in shown and frame["shard_group"].isna().sum() == 1  # the flat cell: no S to tell
    assert "shard_group" not in records_to_frame([flat]).columns
