"""``shardbench report``: table, charts and index.html from the records of one or more runs."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from shardbench.cli.common import UsageError, default_out


def add_report_parser(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser(
        "report", help="table, charts and index.html from the records of one or more runs (merged)"
    )
    rep.add_argument("runs", nargs="+", type=Path, help="run directories or records .jsonl files")
    rep.add_argument(
        "--out",
        type=Path,
        help="report directory (default: the first run's directory; for another records file, "
        "results/runs/report-<its name>)",
    )
    rep.add_argument(
        "--strict", action="store_true", help="fail on a line that is not a record (default: skip it)"
    )


def cmd_report(args: argparse.Namespace) -> int:
    from shardbench.harness.validate import check_output_dir
    from shardbench.records import read_records, records_files
    from shardbench.report.build import build_report
    from shardbench.wording import count

    try:
        inputs = records_files(args.runs)
        if args.strict:
            read_records(inputs, strict=True)
        out = args.out or default_out(args.runs[0], "report")
        check_output_dir(out)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = build_report(args.runs, out)
    except ValueError as e:
        raise UsageError(str(e)) from None
    for w in caught:
        if issubclass(w.category, UserWarning) and "not a record" in str(w.message):
            print(f"shardbench report: warning: {w.message}", file=sys.stderr)
    if result.failures_only:
        print(
            f"shardbench report: warning: {result.failures_only}; the table and charts show failures only",
            file=sys.stderr,
        )
    charts = count(len(result.charts), "chart file")
    print(f"{count(result.records, 'record')}, {charts}; open {result.index_html}")
    return 0
