"""Run a list of cells one after another, appending each record as soon as it exists.

A failed cell (error, OOM, timeout) is recorded and the run goes on; the table is rewritten
after every cell, so an interrupted run keeps everything measured so far.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from bench.harness.config import CellConfig
from bench.harness.launch import run_cell
from bench.harness.records import Record, append_record
from bench.report.tables import write_tables


def _label(cell: CellConfig) -> str:
    return (
        f"{cell.workload}/{cell.preset} {cell.strategy} N={cell.world_size} "
        f"{cell.precision} b={cell.batch_size}"
    )


def run_cells(cells: Sequence[CellConfig], *, out_dir: Path, run_id: str) -> tuple[list[Record], str]:
    """Run every cell with a progress display on stderr; return the records and the table."""
    records: list[Record] = []
    table = ""
    with _progress(len(cells)) as progress:
        for cell in cells:
            progress.start(_label(cell))
            record = run_cell(cell, run_id=run_id)
            append_record(out_dir / "records.jsonl", record)
            records.append(record)
            table = write_tables(records, out_dir)
            progress.done(f"{_label(cell)}: {record.status} ({record.wall_s:.1f}s)")
    return records, table


class _PlainProgress:
    """Line-per-cell progress, used where ``rich`` is not installed (e.g. the bare GPU image)."""

    def __init__(self, total: int) -> None:
        self.total, self.count = total, 0

    def __enter__(self) -> _PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def start(self, label: str) -> None:
        print(f"[{self.count + 1}/{self.total}] {label} ...", file=sys.stderr, flush=True)

    def done(self, message: str) -> None:
        self.count += 1
        print(f"[{self.count}/{self.total}] {message}", file=sys.stderr, flush=True)


class _RichProgress(_PlainProgress):
    def __enter__(self) -> _RichProgress:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(file=sys.stderr),
        )
        self._bar.__enter__()
        self._task = self._bar.add_task("cells", total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(*exc)

    def start(self, label: str) -> None:
        self._bar.update(self._task, description=label)

    def done(self, message: str) -> None:
        self._bar.console.print(message)
        self._bar.advance(self._task)


def _progress(total: int) -> _PlainProgress:
    try:
        import rich  # noqa: F401
    except ImportError:
        return _PlainProgress(total)
    return _RichProgress(total)
