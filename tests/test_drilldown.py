"""``run --memory-snapshot --trace``: each cell writes PyTorch's own artefacts (on the CPU the
memory tracker's per-module table, and a profiler trace of one extra step with our phase labels),
the record lists them relative to the run directory, the report links them, and the measurement
itself is unchanged."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from shardbench.cli.execute import with_drill_down_dir
from shardbench.records import append_record
from shardbench.report.build import build_report, write_report
from tests.cells import run_cell_here, tiny_cell


def test_artefacts_are_written_listed_and_linked(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    plain = tiny_cell(strategy="zero2", world_size=4, simulate=True, steps=1)
    cell = with_drill_down_dir(replace(plain, memory_snapshot=True, trace=True), run_dir)
    assert cell.key() == plain.key()  # drill-down observes a cell, it is not another one
    record = run_cell_here(cell)
    assert record.status == "ok", record.error
    assert set(record.artifacts) == {"memory by module (rank 0)", "trace (rank 0)"}
    table = (run_dir / record.artifacts["memory by module (rank 0)"]).read_text()
    assert "Module:  ShardedDataParallel.module.bert" in table and "Peak-Backward" in table
    trace = (run_dir / record.artifacts["trace (rank 0)"]).read_text()
    assert "shardbench::zero2::reduce" in trace and "shardbench::zero2::step" in trace

    baseline = run_cell_here(plain)
    assert record.peak_mem_bytes == baseline.peak_mem_bytes
    assert record.mem_breakdown_bytes == baseline.mem_breakdown_bytes
    assert baseline.artifacts is None

    append_record(run_dir / "records.jsonl", record)
    page = write_report(run_dir).read_text()
    assert "<h2>Drill-down</h2>" in page
    assert f'href="{record.artifacts["trace (rank 0)"]}"' in page
    merged = build_report([run_dir], tmp_path / "elsewhere" / "merged").index_html.read_text()
    assert f'href="../../run/{record.artifacts["trace (rank 0)"]}"' in merged  # links reach the run's files
