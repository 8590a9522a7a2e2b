"""A suite's ``[[max_size]]`` tables: max-size searches that ``run`` and ``nightly`` do after the
suite's cells, so a baseline saved from ``run`` holds the same answers a night is gated on.

Each table's keys are ``shardbench max-size`` flags (``strategy = ["ddp", "zero2"]``,
``budget = "16GiB"``, ``simulate = true``); they are parsed and validated by that command's own
parser and checks, before any cell runs.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardbench.cli.common import UsageError
from shardbench.harness.config import CellConfig, SuiteSpec

if TYPE_CHECKING:
    from shardbench.harness.launch import JobCells
    from shardbench.studies.plan_reserve import ReservePolicy


@dataclass(frozen=True)
class SuiteSearch:
    where: str
    vary: str
    cells: list[CellConfig]
    budget: int
    reserves: ReservePolicy  # kept beside each peak, as plan keeps them
    ladder: tuple[str, ...] | None  # None: the workload's size family
    resolution: float


def resolve_searches(spec: SuiteSpec) -> list[SuiteSearch]:
    return [
        _resolve(table, f"suite {spec.name!r} [[max_size]] #{i + 1}") for i, table in enumerate(spec.max_size)
    ]


def _resolve(table: dict[str, Any], where: str) -> SuiteSearch:
    from shardbench.cli.max_size import add_max_size_parser, resolve_max_size

    parser = argparse.ArgumentParser(prog="shardbench")
    add_max_size_parser(parser.add_subparsers(dest="command", required=True))

    argv = ["max-size"]
    for key, value in table.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False:
            argv += [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        raise UsageError(f"{where}: not valid max-size flags (argparse said why above)") from None
    try:
        cells, budget, reserves, ladder = resolve_max_size(args)
    except UsageError as e:
        raise UsageError(f"{where}: {e}") from None
    return SuiteSearch(where, args.vary, cells, budget, reserves, ladder, args.resolution)


def run_searches(
    searches: list[SuiteSearch], out: Path, run_id: str, job_cells: JobCells | None = None
) -> int:
    """Each search into the run directory (its probes and its summary record); returns how many
    failed to finish. A failed search is said on stderr and the next one runs: its answer is then
    absent, which ``nightly`` counts as a regression (a missing cell)."""
    from shardbench.studies.maxsize import search

    failed = 0
    for s in searches:
        for cell in s.cells:
            try:
                search(
                    cell,
                    budget=s.budget,
                    reserve=s.reserves.of(cell.strategy),
                    vary=s.vary,
                    ladder=s.ladder,
                    resolution=s.resolution,
                    out_dir=out,
                    run_id=run_id,
                    job_cells=job_cells,
                )
            except Exception as e:  # noqa: BLE001 - one search's crash must not cost the others
                failed += 1
                print(f"{s.where} ({cell.strategy} N={cell.world_size}): failed: {type(e).__name__}: {e}",
                      file=sys.stderr)  # fmt: skip
    return failed


__all__ = ["SuiteSearch", "resolve_searches", "run_searches"]
