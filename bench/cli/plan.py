"""``shardbench plan``: plan every strategy for one model on N ranks within a memory budget,
print one table and the recommendation (``bench/studies/plan.py``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from shardbench.harness.config import DEVICES, CellConfig, fields_from_flags
from shardbench.precision import PRECISIONS
from shardbench.prediction.cluster_network import CLUSTERS

if TYPE_CHECKING:
    from shardbench.harness.launch import CellEndsRun
    from shardbench.harness.runner import Interrupted
    from shardbench.records import Record
    from shardbench.studies.plan import Plan, PlanRow
    from shardbench.studies.plan_reserve import ReservePolicy


def add_plan_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="will a model train on N ranks within a memory budget, and with which strategy",
        description="Plan every strategy for one model on N ranks (one simulated rank each, under "
        "FakeTensorMode where the workload allows: nothing is allocated) and recommend the least "
        "sharding that fits the per-rank budget.",
    )
    _add_plan_cell_arguments(p)
    _add_plan_cluster_arguments(p)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per planned cell")
    p.add_argument("--out", type=Path, help="output directory (default: results/runs/<run_id>)")


def _add_plan_cell_arguments(p: argparse.ArgumentParser) -> None:
    """What is planned: the model, the world, the budget and the strategies to plan it with."""
    from shardbench.studies.plan import PLAN_STRATEGIES

    p.add_argument(
        "--workload", required=True, help="a built-in name, hf:<Arch>, module:factory or file.py:factory"
    )
    p.add_argument("--preset", help="the size preset (default: the workload's first)")
    add_model_config_args(p)
    p.add_argument("--world-size", type=int, required=True, help="ranks (N)")
    p.add_argument("--budget", required=True, help="memory per rank, e.g. 80GiB, 16GiB")
    add_reserve_argument(p)
    p.add_argument("--precision", default="fp32", choices=PRECISIONS, help="training precision")
    batch = p.add_mutually_exclusive_group()
    batch.add_argument("--batch-size", type=int, default=8, help="per-rank batch to plan")
    batch.add_argument(
        "--max-batch", action="store_true", help="search each strategy's largest per-rank batch that fits"
    )
    p.add_argument("--activation-checkpointing", action="store_true", help="recompute blocks in backward")
    p.add_argument(
        "--strategy", type=csv_list(str), default=PLAN_STRATEGIES, help="strategies to plan (comma-separated)"
    )


def _add_plan_cluster_arguments(p: argparse.ArgumentParser) -> None:
    """The hardware the plan is for: the device, the GPU and network its step time is predicted
    on, and the nodes and shard widths of the ranks."""
    p.add_argument(
        "--device",
        choices=DEVICES,
        help="where the planned cells run (default: cuda with --gpu, else cpu)",
    )
    p.add_argument(
        "--gpu",
        help="the GPU a CUDA plan's predicted step time is for, by its datasheet name (H100, H200, A100, "
        "...); implies --device cuda (default: the CUDA device here)",
    )
    p.add_argument(
        "--network",
        help="the network the predicted step time assumes: gloo (measured on this machine at N; "
        "the CPU's default), nvlink (CUDA's default), ib-200 or ib-400 (one flat link); a cluster of "
        f"two tiers ({', '.join(CLUSTERS)}: NVLink inside 8-GPU nodes, InfiniBand across); or your "
        "own tiers, intra=450GB/s:10us,inter=50GB/s:20us (with --ranks-per-node)",
    )
    p.add_argument(
        "--ranks-per-node",
        type=int,
        help="ranks a node holds (G): collectives are costed per tier, and each strategy that shards "
        "in groups is planned at every shard width S that divides N among G/2, G, 2G, ..., N "
        "(default: the cluster's, with a cluster --network)",
    )
    p.add_argument(
        "--shard-group",
        dest="shard_widths",
        type=csv_list(int),
        help="the shard widths S to plan for the strategies that shard in groups, instead of those "
        "--ranks-per-node gives (comma-separated; each must divide N; default: those, else only S = N)",
    )


def resolve_plan(args: argparse.Namespace) -> tuple[list[CellConfig], list[CellConfig], int, ReservePolicy]:
    """Validated cells, one per strategy that can be planned; the cells of those that cannot
    (a peer measured only on real ranks: they get a row, not a run); the budget in bytes; the
    reserves. UsageError if anything is wrong. Sets ``args.device`` to where the plan is for
    (``plan_device``)."""
    from shardbench.harness.bounded import check_workload
    from shardbench.harness.validate import check_timeout, plan_cells
    from shardbench.models.registry import get_workload
    from shardbench.studies.maxsize import parse_budget
    from shardbench.studies.plan import plannable, planning_cells

    args.device = plan_device(args.device, args.gpu)
    if (preset := model_config_preset(args, [args.workload])) is not None:
        args.preset = preset
    try:
        budget = parse_budget(args.budget)
        reserves = reserve_policy(args, budget)
        check_timeout(args.timeout)
        check_gpu(args.gpu)
        check_workload(args.workload, args.preset, timeout_s=args.timeout)  # one's own: bounded first
        workload = get_workload(args.workload)
        preset = args.preset or next(iter(workload.presets))
        fields = fields_from_flags(args)
        strategies = fields.pop("strategy")
        fields.update(preset=preset, fake=not workload.not_plannable)
        if args.max_batch:
            fields["batch_size"] = 1
        args.ranks_per_node, widths = cluster_shape(args)
        cells = planning_cells(**fields, strategies=strategies, shard_widths=widths)
        unplanned = [c for c in cells if not plannable(c.strategy)]
        cells = plan_cells([c for c in cells if plannable(c.strategy)]) if len(unplanned) < len(cells) else []
    except ValueError as e:
        raise UsageError(str(e)) from None
    require_cuda_if(args.device, planned=all(c.fake for c in cells), instead="--device cpu")
    return cells, unplanned, budget, reserves


def cluster_shape(args: argparse.Namespace) -> tuple[int | None, tuple[int, ...]]:
    """The ranks a node holds (``--ranks-per-node``, else the cluster ``--network`` names; a
    world smaller than a node is one node) and the shard widths to plan (``--shard-group``, else
    ``shard_widths`` of the nodes); ValueError in one line for a shape that does not fit N."""
    from shardbench.metrics.topology import check_ranks_per_node
    from shardbench.prediction.cluster_network import check_any_network, cluster_network
    from shardbench.studies.plan import shard_widths

    n, per_node = args.world_size, args.ranks_per_node
    if args.network is not None:
        check_any_network(args.network, per_node)
        if per_node is None and (cluster := cluster_network(args.network)) is not None:
            per_node = cluster.ranks_per_node
    if per_node is not None:
        if isinstance(per_node, int) and per_node > n:
            per_node = n  # the whole world in one node
        check_ranks_per_node(per_node, n)
    widths = tuple(args.shard_widths or ())
    _check_widths(widths, n, args.strategy)
    if widths:
        return per_node, widths
    return per_node, tuple(shard_widths(n, per_node)) if per_node else ()


def _check_widths(widths: tuple[int, ...], world_size: int, strategies: Sequence[str]) -> None:
    """ValueError in one line for a ``--shard-group`` width that does not divide N, or given
    where no strategy asked for shards in groups."""
    from shardbench.harness.shard_width import takes_shard_group
    from shardbench.metrics.topology import divisors

    allowed = divisors(world_size)
    bad = [w for w in widths if w not in allowed]
    if bad:
        raise ValueError(
            f"--shard-group {','.join(map(str, bad))}: each width must divide the world of {world_size} "
            f"ranks; allowed: {', '.join(map(str, allowed))}"
        )

    def grouped_card(name: str) -> bool:
        try:
            return takes_shard_group(name)
        except ValueError:  # an unknown name: refused with the strategies allowed, below
            return False

    grouped = [s for s in strategies if grouped_card(s)]
    if widths and not grouped:
        raise ValueError(
            f"--shard-group: none of {', '.join(strategies)} shards in groups; allowed with: zero1, zero2, "
            "zero3, fsdp2-hsdp, deepspeed-zero3-hpz"
        )


def predicted_rows(
    rows: list[PlanRow], network: str, gpu: str | None = None, ranks_per_node: int | None = None
) -> tuple[PlanRow, ...]:
    """Each planned row with its predicted step time over ``network`` (``record_step_time``),
    against the device's peak (the record's, else this machine's GEMM probe at a real rank's
    threads, or the datasheet of the CUDA device here), or with why none could be made."""
    from dataclasses import replace

    from shardbench.prediction.model_error import with_interval
    from shardbench.prediction.record_step_time import predict_record
    from shardbench.prediction.zero_accounting import comm_shape
    from shardbench.records import UNNAMED_DEVICE

    out = []
    for row in rows:
        r = row.record
        if row.unplanned or row.failed or r.status != "ok":
            out.append(row)
            continue
        try:
            shape = comm_shape(r.workload, r.preset)
        except Exception:  # noqa: BLE001 - the record's own predicted bytes stand in
            shape = None
        try:
            peak = r.peak_flops_per_s or _device_peak(r, gpu)
            predicted, why = predict_record(
                r, network=network, peak=peak, shape=shape, ranks_per_node=ranks_per_node
            )
        except Exception as e:  # noqa: BLE001 - a failed probe costs the plan its prediction only
            predicted, why = None, f"no step time predicted ({type(e).__name__}: {e})"
        if predicted is not None:  # the range this machine's checks of the model give it
            predicted = with_interval(predicted, r.env.get("device_name") or UNNAMED_DEVICE, r.device)
        out.append(replace(row, predicted=predicted, not_predicted=why))
    return tuple(out)


def _device_peak(record: Record, gpu: str | None = None) -> dict[str, Any] | None:
    """The planned device's peak: this CPU's probe, or the datasheet's for ``gpu`` (``--gpu``)
    or the CUDA device here."""
    from shardbench.prediction.flops import matmul_dtype
    from shardbench.prediction.peaks import datasheet_peak, measured_peak
    from shardbench.records import UNNAMED_DEVICE

    counted = record.flops_per_step.dtype if record.flops_per_step else None
    dtype = counted or matmul_dtype(record.precision, record.device)
    if record.device == "cpu":
        name = record.env.get("device_name") or UNNAMED_DEVICE
        return measured_peak("cpu", name, dtype, record.threads_per_rank, torch_version=record.env["torch"])
    if gpu:
        return datasheet_peak(gpu, dtype)
    import torch

    return datasheet_peak(torch.cuda.get_device_name(), dtype) if torch.cuda.is_available() else None


def plan_device(device: str | None, gpu: str | None) -> str:
    """Where the plan is for: ``--device``, else cuda where ``--gpu`` names a GPU (a GPU's
    prediction on a CPU plan would be ignored), else cpu; UsageError for ``--gpu`` with
    ``--device cpu``, which has no GPU to predict for."""
    if gpu is not None and device == "cpu":
        raise UsageError(
            f"--gpu {gpu} names the GPU of a CUDA plan; --device cpu has none: drop --gpu, or give "
            "--device cuda (or no --device)"
        )
    return device or ("cuda" if gpu is not None else "cpu")


def check_gpu(gpu: str | None) -> None:
    """``--gpu`` must name a device of the datasheet table (``bench/prediction/peaks.py``)."""
    from shardbench.prediction.peaks import DATASHEETS, datasheet_peak

    if gpu is not None and datasheet_peak(gpu, "fp32") is None:
        names = ", ".join(sheet.model for sheet in DATASHEETS)
        raise ValueError(f"--gpu {gpu!r} is not in the datasheet table; allowed: {names}")


def cmd_plan(args: argparse.Namespace) -> int:
    implied = args.device is None and args.gpu is not None  # the title says so
    cells, unplanned, budget, reserves = resolve_plan(args)
    from shardbench.harness.runner import new_run_id
    from shardbench.records import read_records
    from shardbench.report.plan_report import print_plan, title
    from shardbench.report.tables import ERRORS_DIR, error_file

    run_id = new_run_id("plan")
    out = args.out or DEFAULT_RUNS_DIR / run_id
    interrupted = _run_plan_cells(args, cells, unplanned, budget, reserves, out=out, run_id=run_id)
    records = [r for r in read_records([out]) if r.run_id == run_id]  # not an earlier plan's in --out
    first = (cells or unplanned)[0]
    plan = _plan_of(args, records, budget, reserves, batch=None if args.max_batch else first.batch_size)
    heading = title(plan, first, budget_text=args.budget, gpu=args.gpu, gpu_implied=implied)
    # the report before any output: a reader gone (| head) ends the command
    report = _write_plan(plan, records, out, heading)
    print_plan(plan, title_text=heading)
    print(f"report: {report}")
    print(f"plan: {out / 'plan.md'}; records: {out / 'records.jsonl'}")
    if any(error_file(r.record) for r in plan.rows):
        print(f"each failed cell's whole error (its traceback): {out / ERRORS_DIR}/")
    if interrupted is not None:
        print(f"{interrupted.because}: the plan covers the cells run before it", file=sys.stderr)
        return interrupted.exit_code
    planned = [r for r in plan.rows if not r.unplanned]
    return 0 if planned and all(r.record.status in ("ok", "oom") for r in planned) else 1


def _run_plan_cells(
    args: argparse.Namespace,
    cells: list[CellConfig],
    unplanned: list[CellConfig],
    budget: int,
    reserves: ReservePolicy,
    *,
    out: Path,
    run_id: str,
) -> Interrupted | CellEndsRun | None:
    """Record the unplanned cells and run the planned ones into ``out`` (with ``--max-batch``,
    each strategy's largest batch that fits with its reserve); what stopped the run, if anything.
    UsageError, before anything is written, for an ``out`` that cannot take them."""
    from shardbench.harness.runner import run_cells
    from shardbench.harness.validate import check_output_dir
    from shardbench.records import append_record
    from shardbench.studies.maxsize import search
    from shardbench.studies.plan import unplanned_record

    try:
        check_output_dir(out, cells=len(cells) + len(unplanned))
    except ValueError as e:
        raise UsageError(str(e)) from None
    out.mkdir(parents=True, exist_ok=True)
    for cell in unplanned:
        append_record(out / "records.jsonl", unplanned_record(cell, run_id=run_id))
    if args.max_batch:
        for cell in cells:  # the largest batch whose peak fits with its reserve, as max-size finds it
            reserve = reserves.of(cell.strategy)
            search(cell, budget=budget, reserve=reserve, vary="batch", out_dir=out, run_id=run_id,
                   job_cells=args.job_cells)  # fmt: skip
        return None
    ran = run_cells(cells, out_dir=out, run_id=run_id, name="plan", tags={}, job_cells=args.job_cells)
    return ran.interrupted


def _plan_of(
    args: argparse.Namespace,
    records: list[Record],
    budget: int,
    reserves: ReservePolicy,
    *,
    batch: int | None,
) -> Plan:
    """The plan the run's records make, each row with its step time predicted over ``--network``
    (the device's default network without one)."""
    from shardbench.prediction.network_profiles import default_network
    from shardbench.studies.plan import Plan, rows_from

    network = args.network or default_network(args.device)
    return Plan(
        rows=predicted_rows(
            rows_from(records, budget, max_batch=args.max_batch, policy=reserves),
            network,
            args.gpu,
            args.ranks_per_node,
        ),
        budget=budget,
        policy=reserves,
        batch=batch,
        ranks_per_node=args.ranks_per_node,
    )


def _write_plan(plan: Plan, records: list[Record], out: Path, heading: str) -> Path | str:
    """plan.md (with the shard-width chart where a strategy was planned at several widths),
    plan.json, the tables and the report into ``out``; the report's path."""
    from shardbench.report.build import write_report
    from shardbench.report.plan_report import PLAN_JSON, plan_json, plan_markdown
    from shardbench.report.shard_width_chart import plot_shard_widths
    from shardbench.report.tables import write_tables

    as_data = plan_json(plan, title_text=heading)
    chart = plot_shard_widths(as_data, out)
    (out / "plan.md").write_text(plan_markdown(plan, title_text=heading, charts=[p.name for p in chart[:1]]))
    (out / PLAN_JSON).write_text(json.dumps(as_data, indent=2) + "\n")
    write_tables(records, out)
    return write_report(out)
