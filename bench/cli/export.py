"""``shardbench export``: a run's records in another tool's format (now: pytest-benchmark's
saved-run JSON, so ``pytest-benchmark compare`` and anything reading that format can show them).

The conversion and what each exported number means are in ``bench/studies/export.py``. Imports
nothing heavy at module level: the CLI's import stays torch-free.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from shardbench.cli.common import UsageError
from shardbench.wording import count

FORMATS = ("pytest-benchmark",)


def add_export_parser(sub: argparse._SubParsersAction) -> None:
    exp = sub.add_parser("export", help="a run's records in another format (pytest-benchmark's saved JSON)")
    exp.add_argument("run", type=Path, help="a run directory (with records.jsonl) or a records .jsonl file")
    exp.add_argument("--format", required=True, choices=FORMATS, help="output format")
    exp.add_argument("--out", type=Path, help="output file (default: standard output)")
    exp.add_argument("--strict", action="store_true", help="refuse a line that is not a record (exit 2)")


def cmd_export(args: argparse.Namespace) -> int:
    from shardbench.records import read_records
    from shardbench.studies.export import to_pytest_benchmark

    run: Path = args.run
    source = run / "records.jsonl" if run.is_dir() else run
    if not source.is_file():
        raise UsageError(f"{run}: not a run directory with records.jsonl nor a records .jsonl file")
    if args.out is not None and args.out.is_dir():
        raise UsageError(f"--out {args.out} is a directory; give a file name")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            records = read_records([source], strict=args.strict)
        except OSError as e:
            raise UsageError(f"{source}: cannot read: {e.strerror or e}") from None
        except ValueError as e:  # --strict: a line that is not a record
            raise UsageError(str(e)) from None
    for w in caught:
        print(f"shardbench export: warning: {w.message}", file=sys.stderr)
    try:
        doc = to_pytest_benchmark(records)
    except ValueError as e:
        raise UsageError(f"{source}: {e}") from None
    text = json.dumps(doc, indent=4, allow_nan=False) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        try:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text)
        except OSError as e:
            raise UsageError(f"--out {args.out} cannot be written: {e.strerror or e}") from None
    meta = doc["shardbench"]
    where = "standard output" if args.out is None else args.out
    print(
        f"exported {count(meta['exported'], 'benchmark')}, skipped {count(len(meta['skipped']), 'record')}; "
        f"wrote {where}",
        file=sys.stderr,
    )
    return 0
