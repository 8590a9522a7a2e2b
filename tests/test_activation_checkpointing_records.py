"""Activation checkpointing as a cell option, end to end without training: suites and flags set
it, records carry it, compare never matches an AC cell with a plain one (an old record without
the field is a plain one), and tables and charts say which cells used it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from shardbench.cli import build_parser
from shardbench.cli.max_size import resolve_max_size
from shardbench.cli.run import resolve_cells
from shardbench.harness.config import load_suite
from shardbench.harness.validate import plan_cells
from shardbench.models.base import Workload
from shardbench.records import parse_record
from shardbench.report.chart_types import group_labels, series_labels
from shardbench.report.tables import records_to_frame
from shardbench.studies.compare import NothingInCommon, compare_runs
from shardbench.studies.export import benchmark_name
from tests.records import make_record

AC = {"activation_checkpointing": True}


def test_a_suite_sets_it_for_all_cells_or_per_matrix(tmp_path: Path) -> None:
    suite = tmp_path / "s.toml"
    suite.write_text(
        "activation_checkpointing = true\n"
        "[[matrix]]\nworld_sizes = [2]\n"
        "[[matrix]]\nworld_sizes = [4]\nactivation_checkpointing = false\n"
    )
    cells = load_suite(str(suite)).cells()
    assert [(c.world_size, c.activation_checkpointing) for c in cells] == [(2, True), (4, False)]
    plain = cells[1]
    assert plain.key() != replace(plain, **AC).key()  # --resume tells them apart


@pytest.mark.parametrize("where", ["", "[[matrix]]\n"])
def test_a_suite_value_that_is_not_a_boolean_is_refused(where: str, tmp_path: Path) -> None:
    suite = tmp_path / "s.toml"
    suite.write_text(f'{where}activation_checkpointing = "yes"\n')
    with pytest.raises(ValueError, match="'activation_checkpointing' must be bool, got 'yes'"):
        load_suite(str(suite))


def test_run_and_max_size_flags_set_it() -> None:
    parser = build_parser()
    run = parser.parse_args(["run", "--workload", "swav", "--world-size", "2", "--activation-checkpointing"])
    _, cells = resolve_cells(run)
    assert cells and all(c.activation_checkpointing for c in cells)
    _, cells = resolve_cells(parser.parse_args(["run", "--workload", "swav", "--world-size", "2"]))
    assert not any(c.activation_checkpointing for c in cells)
    ms = ["max-size", "--workload", "transformer", "--strategy", "ddp", "--world-size", "2"]
    cells, *_ = resolve_max_size(parser.parse_args([*ms, "--budget", "1GiB", "--activation-checkpointing"]))
    assert all(c.activation_checkpointing for c in cells)


def test_a_workload_without_checkpoint_units_is_refused_before_it_runs(tiny_cell, monkeypatch) -> None:
    class NoUnits(Workload):
        name = "no-units"
        presets = {"tiny": {}}
        build = batch = loss = None  # type: ignore[assignment]

    monkeypatch.setattr("shardbench.models.registry.get_workload", lambda name: NoUnits())
    with pytest.raises(ValueError, match="'no-units' declares no activation-checkpointing units"):
        plan_cells([tiny_cell(**AC)])


def test_records_carry_it_and_old_records_read_as_plain() -> None:
    line = json.dumps(make_record(**AC).to_json())
    assert parse_record(line).activation_checkpointing
    old = make_record().to_json()
    del old["activation_checkpointing"]
    assert parse_record(json.dumps(old)).activation_checkpointing is False


def test_compare_never_matches_an_ac_cell_with_a_plain_one() -> None:
    mem = {"peak_mem_bytes": {"max": 1 << 20, "per_rank": [1 << 20]}}
    with pytest.raises(NothingInCommon):
        compare_runs([make_record(**mem)], [make_record(**mem, **AC)])
    old = make_record(**mem).to_json()
    del old["activation_checkpointing"]  # a baseline written before the field: plain cells
    (cell,) = compare_runs([parse_record(json.dumps(old))], [make_record(**mem)]).cells
    assert cell.verdict == "unchanged"
    both = compare_runs([make_record(**mem), make_record(**mem, **AC)], [make_record(**mem, **AC)])
    assert sorted(c.verdict for c in both.cells) == ["missing", "unchanged"]
    assert any(c.cell.endswith("/ac") and c.verdict == "unchanged" for c in both.cells)


def test_tables_charts_and_exports_say_which_cells_used_it() -> None:
    plain, ac = make_record(), make_record(**AC)
    assert "AC" not in records_to_frame([plain]).columns
    assert list(records_to_frame([plain, ac])["AC"]) == [False, True]
    labels = group_labels([plain, ac])
    assert labels[0] != labels[1] and labels[1].endswith("AC")
    assert series_labels([plain, ac]) == ["ddp", "ddp+AC"]
    assert benchmark_name(ac) == benchmark_name(plain) + "/ac"
