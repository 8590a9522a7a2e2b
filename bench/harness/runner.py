"""Run a list of cells one after another, appending each record as soon as it exists.

A failed cell (error, OOM, timeout, divergence) is recorded and the run goes on. After every
record the caller's ``on_record`` sees all records so far (the CLI rewrites the tables there, so a
run stopped half-way keeps everything measured so far); a callback that fails is reported and the
run goes on (the records are what matter). A record that cannot be written stops the run at once
(``RecordWriteError``), since every later cell would be measured into the void.

SIGINT and SIGTERM are turned into ``Interrupted`` while cells run: the cell in flight has its
ranks stopped (the launcher's ``finally``) and is recorded as ``interrupted``, and the caller
writes the report and says how to resume (exit 130 or 143).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from shardbench.harness.config import CellConfig
from shardbench.harness.launch import CellEndsRun, JobCells, import_for, run_cell
from shardbench.harness.result import build_record, with_slow_start
from shardbench.records import CellKey, Record, append_record, flat_as_none, read_records
from shardbench.wording import count, wrap

_RUN_IDS = itertools.count()


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived while cells were running."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def because(self) -> str:
        return f"interrupted by {self}"

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # 130 for SIGINT, 143 for SIGTERM, as shells report them


@dataclass
class RunOutcome:
    records: list[Record] = field(default_factory=list)
    skipped: int = 0
    #: what stopped the run before its last cell: a signal, or a job that lost a process
    interrupted: Interrupted | CellEndsRun | None = None


def new_run_id(name: str) -> str:
    """Time, name, then this process's id and a count of the ids it made: two runs started in
    the same second differ, in one process or in several on a host, by construction."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{name}-{os.getpid():x}.{next(_RUN_IDS)}"


def interleave_repeats(cells: Sequence[CellConfig]) -> list[CellConfig]:
    """The order cells are measured in: the cells of a group (the same workload, preset, world
    size, precision, batch and flags under each strategy) one after another, their repeats in
    rounds, every strategy's repeat 0, then every strategy's repeat 1 (A B A B, not A A B B), so
    a drift of the machine's speed during the group hits each strategy alike and the step-time
    ratios within a run, which ``compare`` gates, stay fair. Where the cells hold an N = 1 cell
    of the reference strategy (``run --scaling``), the group spans every world size of its real
    cells, that cell first in each round, so the scaling efficiencies set against it
    (``bench/studies/scaling.py``) are fair alike. Groups keep the order they first appear in,
    and a group's cells theirs."""
    references = {_wide_key(c) for c in cells if _is_scaling_reference(c)}
    groups: dict[tuple, list[CellConfig]] = {}
    for c in cells:
        wide = _wide_key(c)
        groups.setdefault(wide if wide in references else _group_key(c), []).append(c)
    return [c for group in groups.values() for c in sorted(group, key=lambda c: c.repeat)]


def _group_key(cell: CellConfig) -> tuple:
    key, _repeat = cell.key()
    return key.without("strategy")


def _wide_key(cell: CellConfig) -> tuple:
    """The group across world sizes: what a scaling efficiency's two cells share."""
    key, _repeat = cell.key()
    return ("across world sizes", *key.without("strategy", "world_size"))


def _is_scaling_reference(cell: CellConfig) -> bool:
    from shardbench.strategies.registry import reference_strategy

    return cell.strategy == reference_strategy() and cell.world_size == 1 and not cell.simulate


def done_keys(out_dir: Path, *, ok_only: bool = True) -> set[tuple]:
    """Keys of the cells that already have an ``ok`` record in ``out_dir`` (for ``--resume``);
    with ``ok_only=False``, of every cell recorded there, whatever its status."""
    path = out_dir / "records.jsonl"
    if not path.exists():
        return set()
    return {CellKey.in_run(r) for r in read_records([path]) if r.status == "ok" or not ok_only}


class _Interrupts:
    """SIGINT/SIGTERM handling while cells run: inside a cell the signal raises ``Interrupted``
    (the launcher then stops the ranks); while a record or table is being written it is only
    noted, so the write completes, and the run stops right after it."""

    def __init__(self) -> None:
        self.in_cell = False
        self.pending: Interrupted | None = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.pending = Interrupted(signum)
        if self.in_cell:
            raise self.pending

    @contextlib.contextmanager
    def installed(self) -> Iterator[_Interrupts]:
        previous = {s: signal.signal(s, self._handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    @contextlib.contextmanager
    def cell(self) -> Iterator[None]:
        if self.pending is not None:
            raise self.pending
        self.in_cell = True
        try:
            yield
        finally:
            self.in_cell = False


def run_cells(
    cells: Sequence[CellConfig],
    *,
    out_dir: Path,
    run_id: str,
    skip: set[tuple] | None = None,
    name: str | None = None,
    tags: Mapping[str, str] | None = None,
    on_record: Callable[[list[Record]], object] | None = None,
    job_cells: JobCells | None = None,
) -> RunOutcome:
    """Run every cell not in ``skip`` with a progress display on stderr; every record carries
    the run's ``name`` and ``tags`` (reports label runs by name, compare matches them).
    ``on_record(records)`` runs after each record is appended, with every record so far.
    ``job_cells``: inside a torchrun or Slurm job, what runs each cell on the job's processes."""
    outcome = RunOutcome()
    todo = interleave_repeats([c for c in cells if c.key() not in (skip or set())])
    outcome.skipped = len(cells) - len(todo)
    import_for(todo)  # before the first cell starts the fork server
    with _progress(len(todo)) as progress, _Interrupts().installed() as interrupts:
        for cell in todo:
            progress.start(_label(cell))
            start = time.perf_counter()
            stopped: Interrupted | CellEndsRun | None = None
            try:
                with interrupts.cell():
                    record = (job_cells or run_cell)(cell, run_id=run_id)
            except Interrupted as e:
                record = _interrupted_record(cell, e, run_id=run_id, wall_s=time.perf_counter() - start)
            except CellEndsRun as e:  # this cell's record is the last
                record, stopped = e.record, e
            record.name, record.tags = name, dict(tags or {})
            append_record(out_dir / "records.jsonl", record)
            outcome.records.append(record)
            if on_record is not None:
                try:
                    on_record(outcome.records)
                except Exception as e:  # noqa: BLE001 - the record is safe; what follows is a by-product
                    print(
                        f"shardbench: after the record: {type(e).__name__}: {e}; the run goes on",
                        file=sys.stderr,
                    )
            progress.done(done_line(cell, record))
            if interrupts.pending is not None or stopped is not None:
                outcome.interrupted = interrupts.pending or stopped
                break
    return outcome


def _interrupted_record(cell: CellConfig, e: Interrupted, *, run_id: str, wall_s: float) -> Record:
    from shardbench.harness.result import RankResult

    plan = cell.world_plan()
    results = [
        RankResult(rank=r, status="interrupted", error=f"interrupted by {e} (the run was stopped)")
        for r in range(plan.processes)
    ]
    return build_record(cell, plan, results, run_id=run_id, wall_s=wall_s, processes=plan.processes)


def done_line(cell: CellConfig, record: Record) -> str:
    """What the terminal says of a finished cell: its status and wall time, and a slow start
    where there was one (``harness.result.slow_start``)."""
    return with_slow_start(f"{_label(cell)}: {record.status} ({record.wall_s or 0:.1f}s)", record)


def _label(cell: CellConfig) -> str:
    shards = f"S={cell.shard_group} " if flat_as_none(cell.shard_group, cell.world_size) else ""
    return (
        f"{cell.workload}/{cell.preset} {cell.strategy} N={cell.world_size} {shards}"
        f"{cell.precision} b={cell.batch_size}" + (" AC" if cell.activation_checkpointing else "")
    )


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


#: the progress bar's width, fixed so that a cell's label keeps the rest of the line
BAR_WIDTH = 24


class _RichProgress(_PlainProgress):
    """A bar under the finished cells' lines, on a terminal. Elsewhere (a log, a pipe) only the
    lines: rich draws a bar there once, when it stops, and the running cell's label in it, wrapped
    to the bar's room, would leave its tail ("fp32 b=8") on a line of its own."""

    def __enter__(self) -> _RichProgress:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(file=sys.stderr)
        self._bar = Progress(
            TextColumn("{task.description}", markup=False, style="bold"),
            BarColumn(bar_width=BAR_WIDTH),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            disable=not console.is_terminal,
        )
        self._bar.__enter__()
        self._task = self._bar.add_task("cells", total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        # the bar that stays names what it counted, not the cell that happened to run last
        self._bar.update(self._task, description=count(self.total, "cell"))
        self._bar.__exit__(*exc)

    def start(self, label: str) -> None:
        # wrapped here at word and argument boundaries: cut to the bar's room, rich would end
        # a long label (an hf: preset) in "fs…", losing the strategy's name
        room = max(20, self._bar.console.width - BAR_WIDTH - 20)  # the count and the time
        self._bar.update(self._task, description="\n".join(wrap(label, room)))

    def done(self, message: str) -> None:
        self._bar.console.print(message)
        self._bar.advance(self._task)


def _progress(total: int) -> _PlainProgress:
    try:
        import rich  # noqa: F401
    except ImportError:
        return _PlainProgress(total)
    return _RichProgress(total)
