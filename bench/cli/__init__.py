"""The ``shardbench`` command line: parse, validate, then call into the harness.

Subcommands: ``run`` (a suite or an ad-hoc cross product of cells), ``list`` (workloads with
presets and parameter counts, strategies, suites), ``env`` (what this machine offers). Every
argument is validated before anything is started or written: a mistake is one line on stderr
naming what is allowed, and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench.cli.claim import add_claim_parser, cmd_claim
from bench.cli.common import DEFAULT_RUNS_DIR, UsageError, csv_list, require_cuda_if
from bench.cli.max_size import add_max_size_parser, cmd_max_size
from bench.harness.config import DEVICES, PRECISIONS, CellConfig, SuiteSpec, load_suite, override, suite_names

__all__ = ["UsageError", "build_parser", "main", "resolve_cells"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="shardbench",
        description="Memory and throughput benchmarks for distributed PyTorch training strategies.",
    )
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a suite (default: smoke) or the cells given by flags")
    run.add_argument(
        "--suite", default="smoke", help=f"suite name ({', '.join(suite_names())}) or a .toml path"
    )
    run.add_argument("--workload", type=csv_list(str), help="comma-separated workloads")
    run.add_argument("--strategy", type=csv_list(str), help="comma-separated strategies")
    run.add_argument("--world-size", type=csv_list(int), help="comma-separated world sizes")
    run.add_argument("--preset", type=csv_list(str), help="comma-separated size presets")
    run.add_argument("--precision", type=csv_list(str), help="fp32 and/or bf16")
    run.add_argument("--batch-size", type=csv_list(int), help="per-rank batch size(s)")
    run.add_argument("--steps", type=int, help="measured steps per cell")
    run.add_argument("--warmup", type=int, help="unmeasured warm-up steps per cell")
    run.add_argument("--device", choices=DEVICES, help="cpu or cuda (default: the suite's)")
    run.add_argument("--timeout", type=float, help="seconds per cell before it is recorded as timeout")
    run.add_argument(
        "--simulate",
        action="store_true",
        default=None,
        help="one process plays rank 0 of each world size (fake process group): real "
        "per-rank memory at any N, no communication",
    )
    run.add_argument(
        "--fake",
        action="store_true",
        default=None,
        help="plan without allocating: run each cell under FakeTensorMode on a simulated world "
        "(implies --simulate); memory by category, no step time",
    )
    run.add_argument("--out", type=Path, help="output directory (default: results/runs/<run_id>)")
    add_max_size_parser(sub)
    add_claim_parser(sub)
    rep = sub.add_parser(
        "report",
        help="table, charts and index.html from the records of one or more runs (merged)",
    )
    rep.add_argument("runs", nargs="+", type=Path, help="run directories or records .jsonl files")
    rep.add_argument("--out", type=Path, help="report directory (default: the first run's directory)")
    lst = sub.add_parser("list", help="workloads (presets, parameter counts), strategies, suites")
    lst.add_argument("--json", action="store_true", help="machine-readable output")
    sub.add_parser("env", help="versions and devices of this machine")
    return ap


def resolve_cells(args: argparse.Namespace) -> tuple[SuiteSpec, list[CellConfig]]:
    """The suite with command-line overrides applied and its cells, every value validated
    (raises UsageError naming what is allowed)."""
    from bench.strategies.registry import canonical_name, get_strategy
    from models.registry import get_workload

    try:
        spec = override(
            load_suite(args.suite),
            workloads=args.workload,
            strategies=args.strategy,
            world_sizes=args.world_size,
            presets=args.preset,
            precisions=args.precision,
            batch_sizes=args.batch_size,
            steps=args.steps,
            warmup=args.warmup,
            device=args.device,
            timeout_s=args.timeout,
            simulate=args.simulate,
            fake=args.fake,
        )
        cells = [replace(c, strategy=canonical_name(c.strategy)) for c in spec.cells()]
        for w, p in {(c.workload, c.preset) for c in cells}:
            get_workload(w).check_preset(p)
        for w in {c.workload for c in cells if c.fake}:
            get_workload(w).check_plannable()
    except ValueError as e:
        raise UsageError(str(e)) from None
    if spec.steps < 1 or spec.warmup < 0:
        raise UsageError(f"steps must be >= 1 and warmup >= 0, got steps={spec.steps} warmup={spec.warmup}")
    if spec.device not in DEVICES:
        raise UsageError(f"unknown device {spec.device!r}; allowed: {', '.join(DEVICES)}")
    require_cuda_if(spec.device)
    for c in cells:
        if c.world_size < 1:
            raise UsageError(f"world size must be >= 1, got {c.world_size}")
        if c.precision not in PRECISIONS:
            raise UsageError(f"unknown precision {c.precision!r}; allowed: {', '.join(PRECISIONS)}")
        if c.batch_size < 1:
            raise UsageError(f"batch size must be >= 1, got {c.batch_size}")
        try:
            get_strategy(c.strategy).plan_world(c.world_size, spec.device, c.simulate)
        except ValueError as e:
            raise UsageError(str(e)) from None
    return spec, cells


def cmd_run(args: argparse.Namespace) -> int:
    spec, cells = resolve_cells(args)
    from bench.harness.runner import run_cells

    run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{spec.name}"
    out = args.out or DEFAULT_RUNS_DIR / run_id
    records, table = run_cells(cells, out_dir=out, run_id=run_id)
    print(table)
    print(f"report: {write_report(out)}")
    ok = sum(r.status == "ok" for r in records)
    print(f"{len(records)} cells, {ok} ok; records: {out / 'records.jsonl'}")
    return 0 if all(r.status == "ok" for r in records) else 1


def cmd_report(args: argparse.Namespace) -> int:
    from bench.report.build import build_report

    out = args.out or (args.runs[0] if args.runs[0].is_dir() else args.runs[0].parent)
    try:
        result = build_report(args.runs, out)
    except ValueError as e:
        raise UsageError(str(e)) from None
    print(f"{result.records} records, {len(result.charts)} chart files; open {result.index_html}")
    return 0


def write_report(run_dir: Path) -> Path | str:
    """The run's report (charts, index.html) beside its records. A chart that cannot be drawn
    must not cost the run its measurements: they are already on disk, so say so and go on."""
    from bench.report.build import build_report

    try:
        return build_report([run_dir], run_dir).index_html
    except Exception as e:  # noqa: BLE001 - the records are written; the report is a by-product
        return f"not written ({type(e).__name__}: {e}); rebuild with: shardbench report {run_dir}"


def listing() -> dict:
    from bench.strategies.registry import strategy_classes
    from models.registry import get_workload, workload_names

    workloads = {}
    for name in workload_names():
        w = get_workload(name)
        workloads[name] = {"presets": {p: {"params": w.param_count(p)} for p in w.presets}}
    strategies = {
        c.name: {
            "aliases": list(c.aliases),
            "description": c.description,
            "shards_optimizer_state": c.sharding.optimizer_state,
            "shards_gradients": c.sharding.gradients,
            "shards_parameters": c.sharding.parameters,
            "simulatable": c.simulatable,
        }
        for c in strategy_classes()
    }
    suites = {n: load_suite(n).description for n in suite_names()}
    return {"workloads": workloads, "strategies": strategies, "suites": suites}


def cmd_list(args: argparse.Namespace) -> int:
    data = listing()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print("workloads:")
    for name, w in data["workloads"].items():
        presets = ", ".join(f"{p} ({v['params'] / 1e6:.1f}M)" for p, v in w["presets"].items())
        print(f"  {name}: {presets}")
    print("strategies:")
    for name, s in data["strategies"].items():
        alias = f" (alias: {', '.join(s['aliases'])})" if s["aliases"] else ""
        print(f"  {name}{alias}: {s['description']}")
    print("suites:")
    for name, desc in data["suites"].items():
        print(f"  {name}: {desc}")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    import torch

    from bench.harness.records import capture_env

    env = capture_env("cuda" if torch.cuda.is_available() else "cpu")
    env["cuda_available"] = torch.cuda.is_available()
    env["gloo_available"] = torch.distributed.is_gloo_available()
    env["nccl_available"] = torch.distributed.is_nccl_available()
    print(json.dumps(env, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {
        "run": cmd_run,
        "max-size": cmd_max_size,
        "report": cmd_report,
        "claim": cmd_claim,
        "list": cmd_list,
        "env": cmd_env,
    }[args.command]
    try:
        return handler(args)
    except UsageError as e:
        print(f"shardbench {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
