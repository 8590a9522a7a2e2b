"""Running validated cells as a run: the part ``run`` and ``nightly`` share.

A run directory keeps the cells it was asked for (``cells.json``, what ``--resume`` continues),
its records, tables and report; the suite's max-size searches run after its cells. Its own
module so the subcommands that run cells import it, never each other.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from shardbench.cli.common import DEFAULT_RUNS_DIR, UsageError
from shardbench.cli.suite_searches import SuiteSearch, run_searches
from shardbench.harness.config import CellConfig
from shardbench.paths import path_component
from shardbench.wording import count, program

if TYPE_CHECKING:
    from shardbench.harness.launch import JobCells
    from shardbench.harness.runner import RunOutcome
    from shardbench.records import Record

#: ``--repeat`` beyond this is a typo, not a measurement plan
MAX_REPEAT = 100


CELLS_FILE = "cells.json"

def check_repeat(repeat: int | None) -> int | None:
    if repeat is not None and not 1 <= repeat <= MAX_REPEAT:
        raise UsageError(f"--repeat must be an integer from 1 to {MAX_REPEAT}, got {repeat!r}")
    return repeat


def safe_name(suite: str) -> str:
    """A suite file's stem as a run name (``my.suite.toml`` -> ``my-suite``), safe in a path."""
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in suite) or "run"
    return path_component(name, what="suite name", separators="replace")


def with_drill_down_dir(cell: CellConfig, out: Path) -> CellConfig:
    """The cell with the directory its drill-down artefacts go to, under the run's directory
    (unchanged when it asks for none)."""
    if not (cell.memory_snapshot or cell.trace):
        return cell
    from shardbench.report.chart_types import slug

    flags = ["sim" if cell.simulate and not cell.fake else "", "fake" if cell.fake else ""]
    flags += [cell.device, "ac" if cell.activation_checkpointing else ""]
    flags.append(f"r{cell.repeat}" if cell.repeat else "")
    name = slug(cell.workload, cell.preset, cell.strategy, f"N{cell.world_size}", cell.precision, *flags)
    name += f"-b{cell.batch_size}"
    return replace(cell, drill_down_dir=str(out.resolve() / "drill-down" / name))


def say_first_builds(cells: Iterable[CellConfig]) -> None:
    """Before the cells run, one line for each op a first cell will build before it starts
    (``first_use``): on stderr, beside the progress, so a pipe of the tables stays clean."""
    from shardbench.cli.first_use import deepspeed_build_note

    real = [c for c in cells if not (c.fake or c.simulate)]
    for device in sorted({c.device for c in real}):
        if note := deepspeed_build_note([c.strategy for c in real if c.device == device], device):
            print(note, file=sys.stderr)


class Executed(NamedTuple):
    out: Path
    #: ``run``'s exit code: 0 all ok, 1 a cell failed, 130/143 interrupted
    code: int
    run_id: str
    #: the run stopped before its last cell (a signal, or a job that lost a process)
    stopped: bool = False


def execute_run(
    cells: list[CellConfig],
    *,
    name: str,
    tags: dict[str, str],
    out: Path | None = None,
    resume: Path | None = None,
    searches: Sequence[SuiteSearch] = (),
    columns: Sequence[str] | None = None,
    suite: str | None = None,
    charts: bool = True,
    job_cells: JobCells | None = None,
) -> Executed:
    """Run validated cells into ``out`` (a new run directory by default), then the suite's
    max-size searches, print the table and write the report (without its charts: ``charts``).
    ``job_cells``: inside a torchrun or Slurm job, what runs each cell on the job's processes."""
    from shardbench.harness.runner import done_keys, run_cells
    from shardbench.records import RecordWriteError, latest_outcomes
    from shardbench.report.tables import write_tables

    run_id, name, tags = _run_identity(name, tags, resume)
    out = out or DEFAULT_RUNS_DIR / run_id
    _prepare_out(out, cells, resume=resume, suite=suite)
    cells = [with_drill_down_dir(c, out) for c in cells]
    skip = done_keys(out) if resume is not None else set()
    before = _recorded_before(out, cells, run_id=run_id, name=name) if resume is not None else []
    _say_resumed(skip, cells, out)
    say_first_builds(c for c in cells if c.key() not in skip)
    try:
        outcome = run_cells(
            cells,
            out_dir=out,
            run_id=run_id,
            skip=skip,
            name=name,
            tags=tags,
            on_record=lambda records: write_tables(latest_outcomes([*before, *records]), out),
            job_cells=job_cells,
        )
    except RecordWriteError as e:
        print(
            f"shardbench run: error: {e}; the run stopped (records written so far are kept)", file=sys.stderr
        )
        return Executed(out, 1, run_id)
    searches_failed = 0
    if outcome.interrupted is None:
        searches_failed = run_searches(list(searches), out, run_id, job_cells)
    _print_outcome(out, outcome, before, columns=columns, charts=charts)
    if outcome.interrupted is not None:
        again = f"{program()} run --resume {out}" + ("" if suite is not None else " (and the same flags)")
        print(f"{outcome.interrupted.because}; resume with: {again}", file=sys.stderr)
        return Executed(out, outcome.interrupted.exit_code, run_id, stopped=True)
    failed = searches_failed or any(r.status != "ok" for r in outcome.records)
    return Executed(out, 1 if failed else 0, run_id)


def _run_identity(name: str, tags: dict[str, str], resume: Path | None) -> tuple[str, str, dict[str, str]]:
    """The run's id, name and tags: a new id, or, resumed, the run's own as it goes on."""
    from shardbench.harness.runner import new_run_id
    from shardbench.records import read_records

    run_id = new_run_id(name)
    if resume is not None and (earlier := read_records([resume / "records.jsonl"])):
        run_id, name = earlier[0].run_id, earlier[0].name or name
        tags = {**earlier[0].tags, **tags}
    return run_id, name, tags


def _prepare_out(out: Path, cells: list[CellConfig], *, resume: Path | None, suite: str | None) -> None:
    """Refuse an output directory the run cannot use; a new run of a suite keeps its cells there
    (``cells.json``: what ``--resume`` continues, without the flags)."""
    from shardbench.harness.validate import check_output_dir

    try:
        check_output_dir(out, cells=len(cells))
    except ValueError as e:
        raise UsageError(str(e)) from None
    if resume is None and suite is not None:
        from shardbench.paths import atomic_write_text

        out.mkdir(parents=True, exist_ok=True)
        kept = {"suite": suite, "cells": [c.to_json() for c in cells]}
        atomic_write_text(out / CELLS_FILE, json.dumps(kept, indent=1) + "\n")


def _recorded_before(out: Path, cells: list[CellConfig], *, run_id: str, name: str) -> list[Record]:
    """What a resumed run recorded before, of the cells asked for: its tables and terminal table
    show the whole run, each cell once at its latest outcome, not only the cells run now.
    Refuses a resume whose cells are none of the run's: it would append a different run to it."""
    from shardbench.harness.runner import done_keys
    from shardbench.records import PROBE_SUITE, CellKey, read_records

    asked = {c.key() for c in cells}
    recorded = done_keys(out, ok_only=False)
    if recorded and not asked & recorded:
        raise UsageError(
            f"--resume {out}: none of the {count(len(cells), 'cell')} asked for is a cell of that run "
            f"({name!r}); give the same --suite and flags it was started with"
        )
    return [
        r
        for r in read_records([out / "records.jsonl"])
        if r.run_id == run_id and r.suite != PROBE_SUITE and r.max_size is None and CellKey.in_run(r) in asked
    ]


def _say_resumed(skip: set[tuple], cells: list[CellConfig], out: Path) -> None:
    if skip:
        print(
            f"resume: {len(skip & {c.key() for c in cells})} of {count(len(cells), 'cell')} already ok "
            f"in {out}; "
            "running the rest",
            file=sys.stderr,
        )


def _print_outcome(
    out: Path, outcome: RunOutcome, before: list[Record], *, columns: Sequence[str] | None, charts: bool
) -> None:
    """The report (written before any output: a reader gone, as with ``| head``, ends it), the
    run's table, and where its records and errors are."""
    from shardbench.records import latest_outcomes
    from shardbench.report.build import write_report
    from shardbench.report.tables import ERRORS_DIR, error_file
    from shardbench.report.terminal import DEFAULT_COLUMNS, terminal_table

    report = write_report(out, charts=charts)
    if outcome.records or before:
        print(terminal_table(latest_outcomes([*before, *outcome.records]), columns or DEFAULT_COLUMNS))
    print(f"report: {report} (every column: {out / 'table.md'})")
    records = outcome.records
    ok = sum(r.status == "ok" for r in records)
    skipped = f", {outcome.skipped} skipped (already ok)" if outcome.skipped else ""
    print(f"{count(len(records), 'cell')} run, {ok} ok{skipped}; records: {out / 'records.jsonl'}")
    if any(error_file(r) for r in records):
        print(f"each failed cell's whole error (its traceback): {out / ERRORS_DIR}/")
