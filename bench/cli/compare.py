"""``shardbench compare BASELINE CURRENT``: the regression gate over two runs.

Exit 0: no regression; 1: at least one (a cell that was ok and is not, memory above tolerance,
bytes sent changed, a step-time ratio to ddp's in the same run, or on a dedicated runner the step
time itself, worse beyond its threshold and its noise); 2: bad input or environments that differ.
The decision is ``shardbench.studies.compare.compare_runs``; this module reads, writes and prints.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from shardbench.cli.common import UsageError, add_root_argument, default_out

if TYPE_CHECKING:
    from shardbench.records import Record
    from shardbench.studies.compare import Comparison
    from shardbench.studies.compare_rules import Rules


def add_compare_parser(sub: argparse._SubParsersAction) -> None:
    cmp = sub.add_parser(
        "compare",
        help="compare a run against a baseline: per-cell verdicts, exit 1 on a regression",
    )
    cmp.add_argument("baseline", help="run directory, records .jsonl file, or saved baseline name")
    cmp.add_argument("current", help="run directory, records .jsonl file, or saved baseline name")
    cmp.add_argument("--rules", type=Path, help="TOML thresholds, overrides and ignores (docs/nightly.md)")
    cmp.add_argument("--strict", action="store_true", help="refuse a line that is not a record (exit 2)")
    cmp.add_argument(
        "--out",
        type=Path,
        help="write compare.md/.json/.html here (default: CURRENT's run directory; for another "
        "records file or a saved baseline, results/runs/compare-<its name>)",
    )
    add_root_argument(cmp)
    cmp.add_argument(
        "--allow-env-change",
        action="store_true",
        help="compare even when torch, the device or the record schema differ (rows are marked)",
    )


def cmd_compare(args: argparse.Namespace) -> int:
    from shardbench.harness.validate import check_output_dir
    from shardbench.records import load_records
    from shardbench.studies.baselines import baselines_dir, resolve_source
    from shardbench.studies.compare_rules import Rules, load_rules

    try:
        root = baselines_dir(args.root)
        current_path = resolve_source(args.current, root=root)
        current = load_records(current_path, strict=args.strict)
        baseline_path = resolve_source(args.baseline, device=current[0].device, root=root)
        baseline = load_records(baseline_path, strict=args.strict)
        rules = load_rules(args.rules) if args.rules is not None else Rules()
        out = args.out or default_out(current_path, "compare")
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out} exists and is not a directory")
    except ValueError as e:
        raise UsageError(str(e)) from None
    # compared before --out is made: a refused comparison (nothing in common) leaves no directory
    comparison = compare_or_refuse(baseline, current, rules, allow_env_change=args.allow_env_change)
    try:
        check_output_dir(out, cells=1)
    except ValueError as e:
        raise UsageError(str(e)) from None
    labels = {"baseline_label": str(baseline_path), "current_label": str(current_path)}
    return write_and_print(comparison, out=out, **labels)


def compare_or_refuse(
    baseline: list[Record],
    current: list[Record],
    rules: Rules,
    *,
    allow_env_change: bool,
    missing_fails: bool = False,
    command: str = "compare",
) -> Comparison:
    """``compare_runs``, with the two refusals (environments differ, nothing in common) as
    usage errors: exit 2, as for any bad input. ``compare`` and ``nightly`` both use it."""
    from shardbench.records import none_ok
    from shardbench.studies.compare import EnvironmentChanged, NothingInCommon, compare_runs
    from shardbench.studies.provenance import with_commit_count

    try:
        comparison = compare_runs(
            baseline, current, rules, allow_env_change=allow_env_change, missing_fails=missing_fails
        )
    except (EnvironmentChanged, NothingInCommon) as e:
        raise UsageError(str(e)) from None
    comparison.provenance = comparison.provenance and with_commit_count(comparison.provenance)
    # failed against failed is "unchanged": a verdict with nothing measured must not pass unsaid
    for side, records in (("baseline", baseline), ("current run", current)):
        if failed := none_ok(records):
            print(
                f"shardbench {command}: warning: the {side}: {failed}; nothing in it is gated",
                file=sys.stderr,
            )
    return comparison


def write_and_print(comparison: Comparison, *, out: Path, baseline_label: str, current_label: str) -> int:
    """Write the three files, print the summary and regressions; the exit code."""
    from shardbench.report.compare_report import to_text, write_comparison

    paths = write_comparison(comparison, out, baseline=baseline_label, current=current_label)
    print(to_text(comparison))
    print(f"compare: {paths['html']} (and compare.md, compare.json)", file=sys.stderr)
    return comparison.exit_code
