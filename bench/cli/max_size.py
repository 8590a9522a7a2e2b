"""``shardbench max-size``: parse and validate, then hand each search to ``shardbench.studies.maxsize``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from shardbench.cli.common import (
    DEFAULT_RUNS_DIR,
    UsageError,
    add_model_config_args,
    add_reserve_argument,
    csv_list,
    model_config_preset,
    require_cuda_if,
    reserve_policy,
)
from shardbench.harness.config import DEVICES, CellConfig, fields_from_flags, make_cell
from shardbench.precision import PRECISIONS

if TYPE_CHECKING:
    from shardbench.studies.plan_reserve import ReservePolicy

DEFAULT_RESOLUTION = 0.03  # = shardbench.studies.maxsize's (a test checks), here to keep --help light
DEFAULT_BATCH = 8
#: flags that shape a search over the size family: with --vary batch the batch is what grows
#: and there is no family, so one of them given there would be silently ignored
PARAMS_ONLY = ("batch_size", "resolution", "ladder")
PROBES_PER_SEARCH = 16  # about what a 3% search of a family takes, for the disk-space check


def add_max_size_parser(sub: argparse._SubParsersAction) -> None:
    ms = sub.add_parser(
        "max-size",
        help="largest model (or batch) per rank within a memory budget, by bisection",
        description="Bisect over the workload's size family (every shape of its architecture, "
        "sorted by parameters) until the largest fit and the smallest non-fit are within "
        "--resolution, or over --ladder, or over the batch size; each probe runs in its own "
        "processes with a timeout. A probe fits when its peak and the reserve plan keeps beside it "
        "(none on the CPU; on CUDA the allocator's cache, see --reserve) are within the budget; on "
        "CUDA without --fake the allocator also caps the probe at the budget less any fixed "
        "reserve (a real OOM).",
    )
    ms.add_argument("--workload", required=True, help="one workload")
    ms.add_argument("--strategy", type=csv_list(str), required=True, help="comma-separated strategies")
    ms.add_argument("--world-size", type=csv_list(int), required=True, help="comma-separated world sizes")
    ms.add_argument("--budget", required=True, help="per-rank memory budget, e.g. 16GiB, 2GiB, 512MiB")
    add_reserve_argument(ms)
    ms.add_argument("--vary", default="params", choices=("params", "batch"), help="what grows")
    ms.add_argument(
        "--preset",
        help="the model whose batch grows (--vary batch), or whose size family is searched (--vary "
        "params, without --ladder); default: the workload's first",
    )
    ms.add_argument(
        "--ladder",
        type=csv_list(str),
        help="--vary params: search these presets, smallest first, instead of the size family",
    )
    ms.add_argument(
        "--resolution",
        type=float,
        help="--vary params: stop when the largest fit and the smallest non-fit differ by at most this "
        f"fraction of parameters (default {DEFAULT_RESOLUTION})",
    )
    add_model_config_args(ms)
    ms.add_argument(
        "--batch-size", type=int, help=f"--vary params: the per-rank batch (default {DEFAULT_BATCH})"
    )
    ms.add_argument("--precision", default="fp32", choices=PRECISIONS, help="training precision")
    ms.add_argument("--device", default="cpu", choices=DEVICES, help="where the probes run")
    ms.add_argument("--simulate", action="store_true", help="one process as rank 0 of each world size")
    ms.add_argument("--fake", action="store_true", help="probes under FakeTensorMode (implies --simulate)")
    ms.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="probes recompute each block's activations in backward (torch.utils.checkpoint)",
    )
    ms.add_argument("--steps", type=int, default=1, help="timed steps per probe (default 1)")
    ms.add_argument("--warmup", type=int, default=1, help="warm-up steps per probe (default 1)")
    ms.add_argument("--timeout", type=float, default=900.0, help="seconds per probe")
    ms.add_argument("--out", type=Path, help="output directory (default: results/runs/<run_id>)")


def resolve_max_size(
    args: argparse.Namespace,
) -> tuple[list[CellConfig], int, ReservePolicy, tuple[str, ...] | None]:
    """Validated base cells (one per strategy x world size), the budget in bytes, the reserves
    kept beside each peak (``plan``'s, ``reserve_policy``) and the ladder (None: the workload's
    size family, or its named ladder where it has no family)."""
    from shardbench.harness.validate import check_timeout, plan_cells
    from shardbench.studies.maxsize import parse_budget

    _fill_defaults(args)
    try:
        budget = parse_budget(args.budget)
        reserves = reserve_policy(args, budget)
        resolution = args.resolution
        if not 0 < resolution < 1:
            raise ValueError(f"--resolution must be a fraction between 0 and 1 (e.g. 0.03), got {resolution}")
        check_timeout(args.timeout)
        preset, ladder = _checked_sizes(args)
        given = fields_from_flags(args)
        cells = [
            make_cell(**{**given, "preset": preset, "strategy": s, "world_size": n})
            for s in args.strategy
            for n in args.world_size
        ]
        cells = plan_cells(cells)
    except ValueError as e:
        raise UsageError(str(e)) from None
    require_cuda_if(
        args.device,
        planned=all(c.fake for c in cells),
        instead="--device cpu, or --fake to plan for CUDA from this machine",
    )
    return cells, budget, reserves, ladder


def _fill_defaults(args: argparse.Namespace) -> None:
    """The flags a search reads, refused where they contradict each other and filled in where
    a suite's search left them out."""
    if args.vary == "batch" and (given := [f for f in PARAMS_ONLY if getattr(args, f, None) is not None]):
        flag = "--" + given[0].replace("_", "-")
        raise UsageError(
            f"{flag} shapes a --vary params search; --vary batch grows the batch from 1: drop {flag}"
        )
    if getattr(args, "batch_size", None) is None:
        args.batch_size = DEFAULT_BATCH
    if getattr(args, "resolution", None) is None:
        args.resolution = DEFAULT_RESOLUTION
    if (preset := model_config_preset(args, [args.workload])) is not None:
        args.preset = preset
    if args.vary == "params" and args.ladder and args.preset:
        raise UsageError(
            f"--ladder names every preset the search walks; --preset {args.preset} (or --model-config) "
            "would be ignored: give one of them"
        )


def _checked_sizes(args: argparse.Namespace) -> tuple[str, tuple[str, ...] | None]:
    """The preset the search starts from and the ladder it walks (None: the workload's size
    family), each checked against the workload; ValueError where one is not usable."""
    from shardbench.harness.bounded import check_workload
    from shardbench.models.registry import get_workload

    ladder = tuple(args.ladder) if args.ladder else None
    for preset in ladder or (args.preset,):  # a workload of one's own: in a bounded child first
        check_workload(args.workload, preset, timeout_s=args.timeout, fake=args.fake)
    workload = get_workload(args.workload)
    if args.preset:
        workload.check_preset(args.preset)
    if ladder is None and args.vary == "params" and workload.size_family(args.preset) is None:
        ladder = workload.ladder
    sizes = [workload.param_count(p) for p in ladder or ()]  # (checks each preset's name too)
    for i in range(1, len(ladder or ())):
        if sizes[i] < sizes[i - 1]:
            raise ValueError(
                f"ladder must grow: {ladder[i]!r} ({sizes[i]:,} params) comes after "
                f"{ladder[i - 1]!r} ({sizes[i - 1]:,})"
            )
    preset = args.preset or (ladder[0] if ladder else next(iter(workload.presets), None))
    if preset is None or (args.vary == "params" and ladder == ()):
        raise ValueError(f"workload {args.workload!r} has no size family or ladder; give --ladder")
    workload.check_preset(preset)
    if args.fake:
        workload.check_plannable()
    return preset, ladder


def cmd_max_size(args: argparse.Namespace) -> int:
    cells, budget, reserves, ladder = resolve_max_size(args)
    from shardbench.harness.runner import new_run_id
    from shardbench.harness.validate import check_output_dir
    from shardbench.records import read_records
    from shardbench.report.build import write_report
    from shardbench.report.tables import write_tables
    from shardbench.studies.maxsize import search

    run_id = new_run_id("max-size")
    out = args.out or DEFAULT_RUNS_DIR / run_id
    try:
        check_output_dir(out, cells=len(cells) * PROBES_PER_SEARCH)
    except ValueError as e:
        raise UsageError(str(e)) from None
    for cell in cells:  # each search prints its probes and then its answer, once
        search(
            cell,
            budget=budget,
            reserve=reserves.of(cell.strategy),
            vary=args.vary,
            ladder=ladder,
            resolution=args.resolution,
            out_dir=out,
            run_id=run_id,
            job_cells=args.job_cells,
        )
    write_tables(read_records([out]), out)
    print(f"report: {write_report(out)}")
    print(f"records: {out / 'records.jsonl'}")
    return 0
