"""``shardbench nightly --suite nightly-cpu|nightly-gpu [--baseline NAME]``: the regression gate.

Run the suite (named by date), compare it against the saved baseline, append the night to
``results/history/<suite>.jsonl``, draw the trend, and exit with compare's code (0 no
regression, 1 a regression, 2 bad input). Everything that can be checked before a cell runs is:
the suite, the baseline, the rules, the output and history paths, and that this machine's torch
and device match the baseline's (a nightly on a different machine compares nothing).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bench.cli.common import DEFAULT_RUNS_DIR, UsageError, require_cuda_if, tag_pair

if TYPE_CHECKING:
    from bench.harness.records import Record
    from bench.studies.compare_rules import Rules

HISTORY_DIR = Path("results/history")


def add_nightly_parser(sub: argparse._SubParsersAction) -> None:
    n = sub.add_parser(
        "nightly", help="run a suite, compare it with a baseline, record the trend; exit 1 on regression"
    )
    n.add_argument("--suite", required=True, help="nightly-cpu, nightly-gpu, or any suite name or .toml path")
    n.add_argument("--baseline", help="saved baseline name (default: the suite's name)")
    n.add_argument(
        "--rules", type=Path, help="thresholds TOML (default: bench/suites/rules/<suite>.toml if present)"
    )
    n.add_argument("--out", type=Path, help="run directory (default: results/runs/<run_id>)")
    n.add_argument("--history", type=Path, help="history file (default: results/history/<suite>.jsonl)")
    n.add_argument("--repeat", type=int, help="repeats per timed cell (default: the suite's)")
    n.add_argument(
        "--tag", action="append", type=tag_pair, default=[], metavar="KEY=VALUE", help="label the run"
    )
    n.add_argument(
        "--allow-env-change", action="store_true", help="compare even if torch or the device changed"
    )


def cmd_nightly(args: argparse.Namespace) -> int:
    from bench.cli.run import check_repeat, execute_run
    from bench.harness.config import SUITES_DIR, load_suite, override
    from bench.harness.records import SCHEMA, capture_env
    from bench.harness.runner import new_run_id
    from bench.harness.validate import check_output_dir, plan_cells
    from bench.studies.baselines import find_baseline, load_records
    from bench.studies.compare import ENV_KEYS, env_changes
    from bench.studies.compare_rules import Rules, load_rules

    try:
        spec = override(load_suite(args.suite), repeat=check_repeat(args.repeat))
        cells = plan_cells(spec.cells())
        baseline_name = args.baseline or spec.name
        baseline_path = find_baseline(baseline_name, device=spec.device)
        baseline = load_records(baseline_path)
        rules_path = args.rules or (SUITES_DIR / "rules" / f"{spec.name}.toml")
        rules = load_rules(rules_path) if args.rules or rules_path.exists() else Rules()
        searches = [_max_size_search(table, i, spec.name) for i, table in enumerate(spec.max_size)]
        history = args.history or HISTORY_DIR / f"{spec.name}.jsonl"
        check_output_dir(history.parent, cells=1)
    except ValueError as e:
        raise UsageError(str(e)) from None
    require_cuda_if(spec.device)
    here = capture_env(spec.device)
    probe = [_Probe(here, SCHEMA)]
    changed = env_changes(baseline, probe)  # type: ignore[arg-type]
    if changed and not args.allow_env_change:
        listed = "; ".join(f"{k}: baseline {b}, here {c}" for k, (b, c) in changed.items())
        raise UsageError(
            f"this machine differs from baseline {baseline_name!r} ({listed}); compare would refuse. "
            f"Save a baseline here, or pass --allow-env-change (the {', '.join(ENV_KEYS)} must match)"
        )

    name = f"{spec.name}-{time.strftime('%Y%m%d')}"
    out = args.out or DEFAULT_RUNS_DIR / new_run_id(name)
    tags = {"nightly": spec.name, "baseline": baseline_name, **dict(args.tag)}
    out, run_code = execute_run(cells, name=name, tags=tags, out=out)
    if run_code in (130, 143):  # interrupted: a partial night is not compared or recorded
        return run_code
    _run_searches(searches, out)
    return _gate(args, spec.name, name, out, baseline_name, baseline_path, baseline, rules, history)


def _max_size_search(table: dict, index: int, suite: str) -> tuple[argparse.Namespace, list, int, tuple]:
    """A suite's ``[[max_size]]`` table read as ``shardbench max-size`` flags and validated by
    that command's own parser and checks, before anything runs."""
    from bench.cli import build_parser
    from bench.cli.max_size import resolve_max_size

    argv = ["max-size"]
    for key, value in table.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False:
            argv += [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    where = f"suite {suite!r} [[max_size]] #{index + 1}"
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:
        raise UsageError(f"{where}: not valid max-size flags (argparse said why above)") from None
    try:
        cells, budget, ladder = resolve_max_size(args)
    except UsageError as e:
        raise UsageError(f"{where}: {e}") from None
    return args, cells, budget, ladder


def _run_searches(searches: list, out: Path) -> None:
    """Each max-size search into the night's run directory; its summary records are what the
    gate compares (largest trainable parameters), its probes stay for the report."""
    if not searches:
        return
    from bench.harness.records import read_records
    from bench.report.build import write_report
    from bench.studies.maxsize import search

    run_id = read_records([out])[0].run_id
    for args, cells, budget, ladder in searches:
        for cell in cells:
            search(cell, budget=budget, vary=args.vary, ladder=ladder, out_dir=out, run_id=run_id)
    print(f"report: {write_report(out)}")


class _Probe:
    """This machine's environment shaped like a record, for the pre-run environment check."""

    def __init__(self, env: dict, schema: int) -> None:
        self.env, self.schema = env, schema


def _gate(
    args: argparse.Namespace,
    suite: str,
    name: str,
    out: Path,
    baseline_name: str,
    baseline_path: Path,
    baseline: list[Record],
    rules: Rules,
    history: Path,
) -> int:
    from bench.report.compare_report import to_text, write_comparison
    from bench.studies.baselines import load_records
    from bench.studies.compare import EnvironmentChanged, compare_runs
    from bench.studies.history import append_history, history_lines

    current = load_records(out / "records.jsonl")
    try:
        comparison = compare_runs(baseline, current, rules, allow_env_change=args.allow_env_change)
    except EnvironmentChanged as e:
        raise UsageError(str(e)) from None
    lines = history_lines(
        comparison,
        suite=suite,
        run_id=current[0].run_id,
        name=name,
        baseline=baseline_name,
        git_sha=current[0].env.get("git_sha"),
    )
    append_history(history, lines)
    links = ['<p><a href="index.html">the run\'s report</a></p>']
    trend = _trend(history, out)
    if trend is not None:
        links.append(f'<p><a href="{trend.relative_to(out)}">trend over the nights</a> ({history})</p>')
    write_comparison(
        comparison,
        out,
        baseline=f"{baseline_name} ({baseline_path})",
        current=str(out),
        extra_html="".join(links),
    )
    print(to_text(comparison))
    print(f"nightly: {out / 'compare.html'}; history: {history} (+{len(lines)} lines)", file=sys.stderr)
    return comparison.exit_code


def _trend(history: Path, out: Path) -> Path | None:
    """The trend page, or None (said on stderr) when it cannot be drawn: the gate's verdict is
    already decided and written; a chart must not cost it."""
    try:
        from bench.report.trend_charts import write_trend

        return write_trend(history, out / "trend")
    except Exception as e:  # noqa: BLE001 - a by-product; the comparison stands
        print(f"nightly: trend not drawn ({type(e).__name__}: {e})", file=sys.stderr)
        return None
