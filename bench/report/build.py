"""Build a report folder (table, charts, ``index.html``) from one or more runs' records.

Several inputs are merged into one set of records, so runs from different days or machines are
compared side by side; where two runs measured the same cell, the table gains a ``run_id``
column and the charts split that cell by run instead of letting one hide the other
(``shardbench report RUN_A RUN_B --out DIR``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from shardbench.records import Record, latest_outcomes, load_records, none_ok, records_files
from shardbench.report.html import write_index
from shardbench.report.plan_html import read_plan
from shardbench.report.tables import records_to_frame, write_tables
from shardbench.wording import program


def plot_all(records: Sequence[Record], out_dir: Path) -> dict[str, list[Path]]:
    """Every chart of ``records`` drawn into ``out_dir`` (``chart_drawing.plot_all``). Imported
    here, at the first chart: matplotlib costs a command that writes no chart (``--no-charts``,
    a report of plans) half a second of CPU."""
    from shardbench.report.chart_drawing import plot_all as draw

    return draw(records, out_dir)


@dataclass(frozen=True)
class ReportResult:
    table_md: Path
    table_csv: Path
    index_html: Path
    charts: list[Path] = field(default_factory=list)  # PNG and SVG of every chart, in report order
    records: int = 0
    #: where no record is ok, what they are (``records.none_ok``): a report of failures only
    failures_only: str | None = None


def report_records(paths: Sequence[Path | str], *, links_from: Path | None = None) -> list[Record]:
    """Records of every input, in input order; an input with no records is an error, not a blank.
    ``links_from``: the directory a report of them is written to; each record's drill-down
    artefacts (paths relative to its own run directory) are rewritten relative to it, so a
    merged report's links reach every run's files."""
    records: list[Record] = []
    for f in records_files(paths):
        found = load_records(f)
        if links_from is not None:
            found = [_links_rebased(r, f.parent, links_from) for r in found]
        records.extend(found)
    return records


def _links_rebased(r: Record, run_dir: Path, report_dir: Path) -> Record:
    if not r.artifacts:
        return r
    here = report_dir.resolve()
    moved = {label: os.path.relpath(run_dir.resolve() / path, here) for label, path in r.artifacts.items()}
    return replace(r, artifacts=moved)


def build_report(paths: Sequence[Path | str], out_dir: Path, *, charts: bool = True) -> ReportResult:
    """Merge the records of ``paths`` and write table.md, table.csv, the charts and index.html.
    The report of one plan run leads with the plan (its ``plan.json``); merged runs have no
    one plan to lead with. ``charts=False`` leaves the charts out (``run --no-charts``), and the
    page says how to draw them."""
    out_dir = Path(out_dir)
    # a resumed run's cell is shown once, at its outcome now, not also as the try it replaced
    records = latest_outcomes(report_records(paths, links_from=out_dir))
    inputs = records_files(paths)
    plan = read_plan(inputs[0].parent) if len(inputs) == 1 else None
    out_dir.mkdir(parents=True, exist_ok=True)
    write_tables(records, out_dir)
    drawn = plot_all(records, out_dir) if charts else {}
    frame = records_to_frame(records, tracebacks=True)  # written beside it by write_tables
    undrawn = None if charts else f"Charts not drawn (--no-charts); {program()} report {out_dir} draws them."
    index = write_index(records, frame=frame, charts=drawn, out_dir=out_dir, plan=plan, charts_note=undrawn)
    return ReportResult(
        table_md=out_dir / "table.md",
        table_csv=out_dir / "table.csv",
        index_html=index,
        charts=[p for paths_ in drawn.values() for p in paths_],
        records=len(records),
        failures_only=none_ok(records),
    )


def write_report(run_dir: Path, *, charts: bool = True) -> Path | str:
    """The run's report (charts, index.html) beside its records. A chart that cannot be drawn
    must not cost the run its measurements: they are already on disk, so say so and go on."""
    try:
        return build_report([run_dir], run_dir, charts=charts).index_html
    except Exception as e:  # noqa: BLE001 - the records are written; the report is a by-product
        return f"not written ({type(e).__name__}: {e}); rebuild with: {program()} report {run_dir}"
