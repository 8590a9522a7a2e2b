"""``shardbench max-size``: parse and validate, then hand each search to ``bench.studies.maxsize``."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.cli.common import DEFAULT_RUNS_DIR, UsageError, csv_list, require_cuda_if
from bench.harness.config import DEVICES, PRECISIONS, CellConfig


def add_max_size_parser(sub: argparse._SubParsersAction) -> None:
    ms = sub.add_parser(
        "max-size",
        help="largest model (or batch) per rank within a memory budget, by bisection",
        description="Bisect over the workload's size ladder (or the batch size); each probe runs in "
        "its own processes with a timeout. On CUDA the budget is enforced by the allocator "
        "(a real OOM); on CPU or with --fake a probe fits when its tracked peak is within it.",
    )
    ms.add_argument("--workload", required=True, help="one workload")
    ms.add_argument("--strategy", type=csv_list(str), required=True, help="comma-separated strategies")
    ms.add_argument("--world-size", type=csv_list(int), required=True, help="comma-separated world sizes")
    ms.add_argument("--budget", required=True, help="per-rank memory budget, e.g. 16GiB, 2GiB, 512MiB")
    ms.add_argument("--vary", default="params", choices=("params", "batch"), help="what grows")
    ms.add_argument("--preset", help="the preset (--vary batch; default: the ladder's first)")
    ms.add_argument("--ladder", type=csv_list(str), help="presets, smallest first")
    ms.add_argument("--batch-size", type=int, default=8, help="per-rank batch (--vary params; default 8)")
    ms.add_argument("--precision", default="fp32", choices=PRECISIONS)
    ms.add_argument("--device", default="cpu", choices=DEVICES)
    ms.add_argument("--simulate", action="store_true", help="one process as rank 0 of each world size")
    ms.add_argument("--fake", action="store_true", help="probes under FakeTensorMode (implies --simulate)")
    ms.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="probes recompute each block's activations in backward (torch.utils.checkpoint)",
    )
    ms.add_argument("--steps", type=int, default=1, help="timed steps per probe (default 1)")
    ms.add_argument("--warmup", type=int, default=1, help="warm-up steps per probe (default 1)")
    ms.add_argument("--timeout", type=float, default=900.0, help="seconds per probe (default 900)")
    ms.add_argument("--out", type=Path, help="output directory (default: results/runs/<run_id>)")


def resolve_max_size(args: argparse.Namespace) -> tuple[list[CellConfig], int, tuple[str, ...]]:
    """Validated base cells (one per strategy x world size), the budget in bytes and the ladder."""
    from bench.harness.validate import plan_cells
    from bench.studies.maxsize import parse_budget
    from models.registry import get_workload

    try:
        budget = parse_budget(args.budget)
        workload = get_workload(args.workload)
        ladder = tuple(args.ladder or workload.ladder)
        sizes = [workload.param_count(p) for p in ladder]  # (checks each preset's name too)
        for i in range(1, len(ladder)):
            if sizes[i] < sizes[i - 1]:
                raise ValueError(
                    f"ladder must grow: {ladder[i]!r} ({sizes[i]:,} params) comes after "
                    f"{ladder[i - 1]!r} ({sizes[i - 1]:,})"
                )
        preset = args.preset or (ladder[0] if ladder else None)
        if preset is None:
            raise ValueError(f"workload {args.workload!r} has no size ladder; give --ladder")
        workload.check_preset(preset)
        if args.fake:
            workload.check_plannable()
        simulate = args.simulate or args.fake
        cells = []
        for s in args.strategy:
            for n in args.world_size:
                cells.append(
                    CellConfig(
                        workload=args.workload,
                        preset=preset,
                        strategy=s,
                        world_size=n,
                        precision=args.precision,
                        batch_size=args.batch_size,
                        steps=args.steps,
                        warmup=args.warmup,
                        device=args.device,
                        timeout_s=args.timeout,
                        simulate=simulate,
                        fake=args.fake,
                        activation_checkpointing=args.activation_checkpointing,
                    )
                )
        cells = plan_cells(cells)
    except ValueError as e:
        raise UsageError(str(e)) from None
    require_cuda_if(args.device)
    return cells, budget, ladder


def cmd_max_size(args: argparse.Namespace) -> int:
    cells, budget, ladder = resolve_max_size(args)
    from bench.harness.records import read_records
    from bench.harness.runner import new_run_id
    from bench.harness.validate import check_output_dir
    from bench.report.build import write_report
    from bench.report.tables import write_tables
    from bench.studies.maxsize import search

    run_id = new_run_id("max-size")
    out = args.out or DEFAULT_RUNS_DIR / run_id
    try:
        check_output_dir(out, cells=len(cells) * len(ladder))
    except ValueError as e:
        raise UsageError(str(e)) from None
    summaries = [
        search(cell, budget=budget, vary=args.vary, ladder=ladder, out_dir=out, run_id=run_id)
        for cell in cells
    ]
    write_tables(read_records([out]), out)
    print(f"report: {write_report(out)}")
    for s in summaries:
        print(s.note)
    print(f"records: {out / 'records.jsonl'}")
    return 0
