"""A resumed run shows its final state: each cell once, at its latest outcome, in table.md, the
report and the terminal table, which lists the whole run and not only the cells run now."""

from __future__ import annotations

import json
from pathlib import Path

from shardbench.cli import main
from shardbench.records import latest_outcomes, read_records
from shardbench.report.build import build_report
from tests.records import make_record

SHAPE = dict(requested_world_size=2, batch_size_per_rank=8)
EARLIER = dict(run_id="night-1", name="night", tags={"k": "v"}, **SHAPE)


def _interrupted_then_ok(run: Path) -> None:
    """A run whose zero2 cell was interrupted, then run again to ``ok`` by a resume."""
    run.mkdir(parents=True, exist_ok=True)
    lines = [
        make_record(strategy="ddp", **EARLIER),
        make_record(strategy="zero2", status="interrupted", **EARLIER),
        make_record(strategy="zero2", **EARLIER),
    ]
    (run / "records.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in lines))


def _status_rows(table_md: str) -> list[tuple[str, str]]:
    """(strategy, status) of each row of a table.md."""
    lines = [line for line in table_md.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    return [(row[header.index("strategy")], row[header.index("status")]) for row in rows]


def test_latest_outcomes_keeps_each_cell_once_at_its_latest_record() -> None:
    first = make_record(strategy="zero2", status="interrupted", **EARLIER)
    again = make_record(strategy="zero2", wall_s=2.0, **EARLIER)
    other_run = make_record(strategy="zero2", run_id="night-2", **SHAPE)
    probes = [make_record(suite="max-size-probe", status=s, **EARLIER) for s in ("timeout", "ok")]
    ddp = make_record(strategy="ddp", **EARLIER)
    kept = latest_outcomes([ddp, first, other_run, *probes, again])
    assert kept == [ddp, again, other_run, *probes]  # the cell keeps its place, a probe retry stays


def test_report_of_a_resumed_run_lists_each_cell_once(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("shardbench.report.build.plot_all", lambda records, out_dir: {})
    _interrupted_then_ok(tmp_path / "run")
    result = build_report([tmp_path / "run"], tmp_path / "run", charts=False)
    assert _status_rows(result.table_md.read_text()) == [("ddp", "ok"), ("zero2", "ok")]
    assert result.records == 2
    assert len(read_records([tmp_path / "run"])) == 3  # what happened stays in the records


def test_resume_shows_the_whole_run_at_its_latest_outcomes(tmp_path: Path, monkeypatch, capsys) -> None:
    """ddp ok, zero1 interrupted, zero2 not reached, then ``run --resume``: zero1 and zero2 run,
    and table.md (between cells and at the end) and the terminal table hold every cell of the
    run once, at its latest outcome."""
    from shardbench.cli.execute import CELLS_FILE
    from tests.cells import tiny_cell

    run = tmp_path / "r"
    run.mkdir()
    records = [
        make_record(strategy="ddp", **EARLIER),
        make_record(strategy="zero1", status="interrupted", **EARLIER),
    ]
    (run / "records.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    cells = [tiny_cell(strategy=s, world_size=2, batch_size=8) for s in ("ddp", "zero1", "zero2")]
    (run / CELLS_FILE).write_text(json.dumps({"suite": "smoke", "cells": [c.to_json() for c in cells]}))
    tables_between: list[list[tuple[str, str]]] = []

    def stand_in(cell, run_id):
        if cell.strategy == "zero2":  # the table as the resume rewrote it after zero1
            tables_between.append(_status_rows((run / "table.md").read_text()))
        return make_record(strategy=cell.strategy, run_id=run_id, **SHAPE)

    monkeypatch.setattr("shardbench.harness.runner.run_cell", stand_in)
    monkeypatch.setattr("shardbench.report.build.plot_all", lambda records, out_dir: {})
    assert main(["run", "--resume", str(run)]) == 0
    assert tables_between == [[("ddp", "ok"), ("zero1", "ok")]]
    everything = [("ddp", "ok"), ("zero1", "ok"), ("zero2", "ok")]
    assert _status_rows((run / "table.md").read_text()) == everything
    table = capsys.readouterr().out.split("report:")[0]
    rows = [line.split() for line in table.splitlines() if line.startswith("transformer  ")]
    assert [(row[2], row[4]) for row in rows] == everything, table
    assert [r.status for r in read_records([run])] == ["ok", "interrupted", "ok", "ok"]
