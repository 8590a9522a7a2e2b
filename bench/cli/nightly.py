"""``shardbench nightly --suite nightly-cpu|nightly-gpu [--baseline NAME]``: the regression gate.

Run the suite (named by date) and its max-size searches, compare the night with the saved
baseline, append it to ``<root>/history/<suite>.jsonl``, draw the trend, and exit with
compare's code (0 no regression, 1 a regression, 2 bad input). Everything that can be checked
before a cell runs is: the suite, the baseline, the rules, the output and history paths, and that
this machine's torch and device match the baseline's (a night on another machine compares
nothing). The suite is fixed, so a baseline cell the night did not record is a regression: a
lost measurement must not pass the gate. After the run, the verdict is printed first and each
file is written on its own, so a failing write costs only that file.
"""

from __future__ import annotations

import argparse
import fcntl
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from shardbench.cli.common import (
    DEFAULT_RUNS_DIR,
    UsageError,
    add_root_argument,
    require_cuda_if,
    require_env_of,
    tag_pair,
)
from shardbench.wording import count

if TYPE_CHECKING:
    from shardbench.cli.execute import Executed
    from shardbench.harness.config import CellConfig, SuiteSpec
    from shardbench.records import Record
    from shardbench.studies.compare import Comparison
    from shardbench.studies.compare_rules import Rules

T = TypeVar("T")


def add_nightly_parser(sub: argparse._SubParsersAction) -> None:
    n = sub.add_parser(
        "nightly", help="run a suite, compare it with a baseline, record the trend; exit 1 on regression"
    )
    n.add_argument("--suite", required=True, help="nightly-cpu, nightly-gpu, or any suite name or .toml path")
    n.add_argument("--baseline", help="saved baseline name (default: the suite's name)")
    n.add_argument(
        "--rules", type=Path, help="thresholds TOML (default: bench/suites/rules/<suite>.toml if present)"
    )
    n.add_argument("--out", type=Path, help="run directory, new or empty (default: results/runs/<run_id>)")
    n.add_argument("--history", type=Path, help="history file (default: <root>/history/<suite>.jsonl)")
    add_root_argument(n)
    n.add_argument("--repeat", type=int, help="repeats per timed cell (default: the suite's)")
    n.add_argument(
        "--tag", action="append", type=tag_pair, default=[], metavar="KEY=VALUE", help="label the run"
    )
    n.add_argument(
        "--allow-env-change", action="store_true", help="compare even if torch or the device changed"
    )


def cmd_nightly(args: argparse.Namespace) -> int:
    from shardbench.cli.compare import compare_or_refuse
    from shardbench.cli.execute import safe_name
    from shardbench.cli.suite_searches import resolve_searches
    from shardbench.harness.runner import new_run_id
    from shardbench.records import load_records

    night = _Night.checked(args)
    spec, baseline = night.spec, night.baseline
    searches = resolve_searches(spec)
    require_cuda_if(
        spec.device, asked=f"suite {spec.name!r} (on cuda)", instead="a CPU suite (--suite nightly-cpu)"
    )
    require_env_of(baseline, spec.device, f"baseline {night.baseline_name!r}", allow=args.allow_env_change)

    name = f"{safe_name(spec.name)}-{time.strftime('%Y%m%d')}"
    out = args.out or DEFAULT_RUNS_DIR / new_run_id(name)
    tags = {"nightly": spec.name, "baseline": night.baseline_name, **dict(args.tag)}
    done = _run_alone(out, night.cells, name=name, tags=tags, searches=searches, job_cells=args.job_cells)
    if done.stopped:  # interrupted, or its job lost a process: a partial night is not compared or recorded
        return done.code
    try:
        current = [r for r in load_records(done.out / "records.jsonl") if r.run_id == done.run_id]
    except ValueError as e:
        print(f"shardbench nightly: error: {e}; nothing to compare", file=sys.stderr)
        return 1
    comparison = compare_or_refuse(
        baseline,
        current,
        night.rules,
        allow_env_change=args.allow_env_change,
        missing_fails=True,
        command="nightly",
    )
    print(
        _gate_files(
            comparison,
            args,
            spec.name,
            name,
            done.out,
            night.baseline_name,
            night.baseline_path,
            night.history,
            current,
        )
    )
    return comparison.exit_code


@dataclass(frozen=True)
class _Night:
    """What a night is checked against, every part read and checked before a cell runs."""

    spec: SuiteSpec
    cells: list[CellConfig]
    baseline_name: str
    baseline_path: Path
    baseline: list[Record]
    rules: Rules
    history: Path

    @classmethod
    def checked(cls, args: argparse.Namespace) -> _Night:
        from shardbench.cli.common import cuda_devices
        from shardbench.cli.execute import check_repeat
        from shardbench.harness.config import SUITES_DIR, load_suite, override
        from shardbench.harness.validate import check_output_dir, plan_cells
        from shardbench.paths import history_file
        from shardbench.records import load_records
        from shardbench.studies.baselines import baselines_dir, find_baseline
        from shardbench.studies.compare_rules import Rules, load_rules

        try:
            spec = override(load_suite(args.suite), repeat=check_repeat(args.repeat)).for_devices(
                cuda_devices()
            )
            cells = plan_cells(spec.cells())
            baseline_name = args.baseline or spec.name
            baseline_path = find_baseline(baseline_name, device=spec.device, root=baselines_dir(args.root))
            baseline = load_records(baseline_path)
            rules_path = args.rules or (SUITES_DIR / "rules" / f"{spec.name}.toml")
            rules = load_rules(rules_path) if args.rules or rules_path.exists() else Rules()
            history = args.history or history_file(spec.name, args.root)
            if history.is_dir():
                raise ValueError(f"--history {history} is a directory; give the history's .jsonl file")
            check_output_dir(history.parent, cells=1)
            out = args.out
            if out is not None and out.exists() and (not out.is_dir() or any(out.iterdir())):
                raise ValueError(f"--out {out}: not an empty directory; a night needs its own directory")
        except ValueError as e:
            raise UsageError(str(e)) from None
        return cls(spec, cells, baseline_name, baseline_path, baseline, rules, history)


def _run_alone(out: Path, cells: list[CellConfig], **run: Any) -> Executed:
    """The night's run into ``out``, under a lock there: a second night in the same ``--out`` is
    refused."""
    from shardbench.cli.execute import execute_run

    out.mkdir(parents=True, exist_ok=True)
    lock_path = out / ".nightly.lock"
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise UsageError(f"--out {out}: another nightly is running into it") from None
        try:
            return execute_run(cells, out=out, **run)
        finally:
            # removed while still held: a night that starts after it finds the folder full and is
            # refused for that, and the folder keeps only the night's own files
            lock_path.unlink(missing_ok=True)


def _gate_files(
    comparison: Comparison,
    args: argparse.Namespace,
    suite: str,
    name: str,
    out: Path,
    baseline_name: str,
    baseline_path: Path,
    history: Path,
    current: list[Record],
) -> str:
    """Print the verdict, then write the history, the trend and the compare files, each on its
    own (a failed write is said and the rest go on); returns the verdict text."""
    from shardbench.report.compare_report import to_text, write_comparison
    from shardbench.studies.history import append_history, history_lines

    text = to_text(comparison)
    print(text, flush=True)
    lines = history_lines(
        comparison,
        suite=suite,
        run_id=current[0].run_id,
        name=name,
        baseline=baseline_name,
        git_sha=current[0].env.get("git_sha"),
    )
    _try(f"history {history}", lambda: append_history(history, lines))
    trend = _try("trend", lambda: _write_trend(history, out))
    extra = '<p><a href="index.html">the run\'s report</a></p>' + (trend or "")
    _try(
        "compare files",
        lambda: write_comparison(
            comparison, out, baseline=f"{baseline_name} ({baseline_path})", current=str(out), extra_html=extra
        ),
    )
    return f"nightly: {out / 'compare.html'}; history: {history} (+{count(len(lines), 'line')})"


def _write_trend(history: Path, out: Path) -> str:
    """The trend charts, drawn into ``out/trend`` and shown in the night's compare page."""
    import html

    from shardbench.report.trend_charts import write_trend

    page = write_trend(history, out / "trend")
    images = "".join(
        f'<figure><img src="trend/{html.escape(p.name)}" alt="{html.escape(p.stem)}"></figure>'
        for p in sorted(page.parent.glob("*.png"))
    )
    link = f'<a href="trend/{page.name}">trend page</a> ({html.escape(str(history))})'
    return f"<h2>Trend</h2><p>{link}</p>{images}"


def _try(what: str, action: Callable[[], T]) -> T | None:
    """``action()``, or None with a line on stderr: the verdict is already decided and printed."""
    try:
        return action()
    except Exception as e:  # noqa: BLE001 - a by-product of the gate must not cost the gate
        print(f"shardbench nightly: {what} not written ({type(e).__name__}: {e})", file=sys.stderr)
        return None
