"""``shardbench run``: a suite (default: smoke) or the cross product given by flags."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from shardbench.cli.common import (
    UsageError,
    add_model_config_args,
    choices_metavar,
    csv_choices,
    csv_list,
    cuda_devices,
    model_config_preset,
    require_cuda_if,
    tag_pair,
)
from shardbench.cli.execute import CELLS_FILE, check_repeat, execute_run, safe_name
from shardbench.harness.config import (
    DEVICES,
    FLAG_FIELDS,
    CellConfig,
    SuiteSpec,
    fields_from_flags,
    load_suite,
    override,
    scaling_reference,
    suite_names,
    suite_overrides,
)
from shardbench.precision import PRECISIONS
from shardbench.records import CellKey
from shardbench.wording import count, program


def add_run_parser(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run a suite (default: smoke) or the cells given by flags")
    smoke = load_suite(DEFAULT_SUITE)
    _add_cell_arguments(run, smoke)
    _add_measurement_arguments(run, smoke)
    _add_labelling_arguments(run)
    _add_output_arguments(run)


def _suite_default(value: object) -> str:
    """What an option defaults to: the suite's, and the default suite's value."""
    shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
    return f"(default: the suite's; {DEFAULT_SUITE}: {shown})"


def _add_cell_arguments(run: argparse.ArgumentParser, smoke: SuiteSpec) -> None:
    """The axes whose cross product makes the cells: the suite, or the flags that override its
    axes (``smoke``: the default suite, whose values the help shows)."""
    run.add_argument(
        "--suite", help=f"suite name ({', '.join(suite_names())}) or a .toml path (default: {DEFAULT_SUITE})"
    )
    run.add_argument(
        "--workload", type=csv_list(str), help=f"comma-separated workloads {_suite_default(smoke.workloads)}"
    )
    multi = f"; {','.join(smoke.multi_gpu_strategies)} too on >= 2 GPUs" if smoke.multi_gpu_strategies else ""
    run.add_argument(
        "--strategy",
        type=csv_list(str),
        help=f"comma-separated strategies {_suite_default(smoke.strategies)[:-1]}{multi})",
    )
    run.add_argument(
        "--world-size",
        type=csv_list(int),
        help=f"comma-separated world sizes {_suite_default(smoke.world_sizes)}",
    )
    run.add_argument(
        "--preset", type=csv_list(str), help=f"comma-separated size presets {_suite_default(smoke.presets)}"
    )
    add_model_config_args(run)
    run.add_argument(
        "--precision",
        type=csv_choices(PRECISIONS),
        metavar=choices_metavar(PRECISIONS),
        help=f"training precision(s), comma-separated {_suite_default(smoke.precisions)}",
    )
    run.add_argument(
        "--batch-size", type=csv_list(int), help=f"per-rank batch size(s) {_suite_default(smoke.batch_sizes)}"
    )
    run.add_argument(
        "--shard-group",
        type=csv_list(int),
        metavar="S[,...]",
        help="hybrid sharding: shard within groups of S ranks and replicate across the N/S groups, "
        "for the strategies that take it (zero1, zero2, zero3, fsdp2-hsdp, ...); S must divide the "
        "world size (default: the suite's, else S = N: over all ranks)",
    )
    run.add_argument(
        "--ranks-per-node",
        type=int,
        metavar="G",
        help="ranks a node holds: each collective's bytes are accounted within a node and across "
        "nodes (default: the suite's, else the torchrun or Slurm job's, else one node)",
    )


def _add_measurement_arguments(run: argparse.ArgumentParser, smoke: SuiteSpec) -> None:
    """How each cell is measured: its steps, where it runs, and how it is simulated."""
    run.add_argument("--steps", type=int, help=f"measured steps per cell {_suite_default(smoke.steps)}")
    run.add_argument(
        "--warmup", type=int, help=f"unmeasured warm-up steps per cell {_suite_default(smoke.warmup)}"
    )
    run.add_argument("--device", choices=DEVICES, help=f"where the cells run {_suite_default(smoke.device)}")
    run.add_argument(
        "--timeout",
        type=float,
        help=f"seconds per cell before it times out {_suite_default(smoke.timeout_s)}",
    )
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
    run.add_argument(
        "--activation-checkpointing",
        action="store_true",
        default=None,
        help="recompute each transformer block / ResNet bottleneck / recurrent layer in backward "
        "instead of keeping its activations (torch.utils.checkpoint, non-reentrant)",
    )


def _add_labelling_arguments(run: argparse.ArgumentParser) -> None:
    """What the run is called and labelled with, and how often and against what it is measured."""
    run.add_argument(
        "--name",
        help="a name for the run (default: the suite's when every cell is one of the suite's, else the "
        "workloads'); the run id adds time and a suffix",
    )
    run.add_argument(
        "--tag",
        action="append",
        type=tag_pair,
        default=[],
        metavar="KEY=VALUE",
        help="label the run (repeatable), e.g. --tag branch=main --tag gpu=h200; records carry the tags",
    )
    run.add_argument(
        "--repeat",
        type=int,
        help="run each timed cell R times, each in fresh processes; compare uses the median of "
        "the repeats and their spread as noise (default: the suite's repeat, else 1)",
    )
    run.add_argument(
        "--scaling",
        action="store_true",
        default=None,
        help="measure scaling efficiency: add each real N>1 cell's N=1 cell (ddp at world size 1, "
        "all else equal) and run it in the same rounds; tables and the report show per-rank "
        "samples/s at N over the N=1 cell's (docs/measuring.md; default: the suite's scaling)",
    )


def _add_output_arguments(run: argparse.ArgumentParser) -> None:
    """Where the run is written, what else is written with it, and resuming one written before."""
    run.add_argument("--out", type=Path, help="output directory (default: results/runs/<run_id>)")
    run.add_argument(
        "--memory-snapshot",
        action="store_true",
        help="also write PyTorch's memory artefacts of each cell into the run's drill-down/: on CUDA an "
        "allocator snapshot (open at pytorch.org/memory_viz), on the CPU or --fake the memory "
        "tracker's per-module table; the report links them",
    )
    run.add_argument(
        "--trace",
        action="store_true",
        help="also profile one extra step of each cell (torch.profiler) into a Chrome trace in the "
        "run's drill-down/, our phases labelled shardbench::...; the report links it",
    )
    run.add_argument(
        "--no-charts",
        dest="charts",
        action="store_false",
        help="write the report without its charts, seconds less a run where only the records and "
        f"tables are read (a CI gate, a job's runs); '{program()} report RUN_DIR' draws them later",
    )
    from shardbench.report.terminal import COLUMNS, DEFAULT_COLUMNS

    run.add_argument(
        "--columns",
        type=csv_list(str),
        help="columns of the terminal table by their headers, comma-separated, any case (table.md has "
        f"them all); default: {','.join(DEFAULT_COLUMNS)}; also: "
        + ",".join(c for c in COLUMNS if c not in DEFAULT_COLUMNS)
        + " (what says which cell a row is, left out, leads the table: workload and strategy always, "
        "preset, N, prec, batch and flags where the rows differ in them)",
    )
    run.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR: its own cells (kept in RUN_DIR/cells.json; no other "
        "flags needed), running only those with no ok record there",
    )


def resolve_cells(args: argparse.Namespace) -> tuple[SuiteSpec, list[CellConfig]]:
    """The suite with command-line overrides applied and its cells, validated and planned
    (raises UsageError naming what is allowed)."""
    from shardbench.harness.validate import plan_cells

    preset = model_config_preset(args, args.workload)
    presets = (preset,) if preset is not None else args.preset
    try:
        changes = suite_overrides({**fields_from_flags(args), "preset": presets})
        spec = override(
            load_suite(args.suite or DEFAULT_SUITE),
            **changes,
            repeat=check_repeat(args.repeat),
            scaling=args.scaling,
        ).for_devices(cuda_devices())
        cells = plan_cells(own_presets(spec.cells()) if presets is None else spec.cells())
    except ValueError as e:
        raise UsageError(str(e)) from None
    if (args.repeat or 1) > 1 and all(c.fake for c in cells):
        raise UsageError(
            f"--repeat {args.repeat} repeats timed cells, and --fake cells time nothing (their memory "
            "is the same every run): drop --repeat, or --fake to time the cells"
        )
    if args.scaling and not any(scaling_reference(c) for c in cells):
        raise UsageError(
            "--scaling: no real cell at N > 1 to set against N = 1 (simulated and fake worlds time no "
            "communication); give --world-size 2 or more, without --simulate or --fake"
        )
    require_cuda_if(
        spec.device,
        planned=all(c.fake for c in cells),
        instead="--device cpu, or --fake to plan for CUDA from this machine",
    )
    return spec, cells


def cmd_run(args: argparse.Namespace) -> int:
    from shardbench.cli.suite_searches import resolve_searches
    from shardbench.report.terminal import DEFAULT_COLUMNS, check_columns

    try:
        columns = check_columns(args.columns) if args.columns else DEFAULT_COLUMNS
    except ValueError as e:
        raise UsageError(f"--columns: {e}") from None
    if args.resume is not None:
        if args.name is not None:  # the records already written carry the run's name
            raise UsageError("--resume RUN_DIR goes on under that run's own name; drop --name")
        if args.out is not None and args.out.resolve() != args.resume.resolve():
            raise UsageError("--resume RUN_DIR writes into RUN_DIR; drop --out or give the same directory")
        if not (args.resume / "records.jsonl").is_file():
            raise UsageError(
                f"--resume {args.resume}: no records.jsonl there; give the directory of an earlier run"
            )
    saved = saved_cells(args.resume) if args.resume is not None else None
    if saved is not None and not any(getattr(args, flag) for flag in CELL_FLAGS):
        # the run's own cells, as it was started: nothing to repeat on the command line
        suite, cells = saved
        try:
            spec = load_suite(suite)
        except ValueError as e:
            raise UsageError(f"--resume {args.resume}: its suite {suite!r}: {e}") from None
    else:
        suite = args.suite or DEFAULT_SUITE
        spec, cells = resolve_cells(args)
        if args.memory_snapshot or args.trace:
            cells = [replace(c, memory_snapshot=args.memory_snapshot, trace=args.trace) for c in cells]
        if saved is not None and {c.key() for c in cells} != {c.key() for c in saved[1]}:
            raise UsageError(
                f"--resume {args.resume} continues that run's {count(len(saved[1]), 'cell')}; the "
                f"flags given make a different set of {len(cells)}: drop them (the run remembers its "
                "own), or start a new run"
            )
    searches = resolve_searches(spec)
    name = (
        check_run_name(args.name) if args.name is not None else run_name(suite, cells, scaling=args.scaling)
    )
    out = args.resume or args.out
    return execute_run(
        cells,
        name=name,
        tags=dict(args.tag),
        out=out,
        resume=args.resume,
        searches=searches,
        columns=columns,
        suite=args.suite or DEFAULT_SUITE,
        charts=args.charts,
        job_cells=args.job_cells,
    ).code


DEFAULT_SUITE = "smoke"
#: the flags that choose a run's cells: ``--resume`` without any of them continues the run's own
CELL_FLAGS = (
    "suite",
    *FLAG_FIELDS,
    "repeat",
    "scaling",
    "model_config",
    "seq_len",
    "memory_snapshot",
    "trace",
)


#: where a run keeps the cells it was started with (what ``--resume`` continues)
def saved_cells(run_dir: Path) -> tuple[str, list[CellConfig]] | None:
    """The suite and cells ``run_dir``'s run was started with, or None for a run that did not
    keep them (one written before runs kept them: its flags must then be given again)."""
    path = run_dir / CELLS_FILE
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
        return saved["suite"], [CellConfig.from_json(c) for c in saved["cells"]]
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"--resume {run_dir}: {path.name} is not what a run writes ({e})") from None


def own_presets(cells: list[CellConfig]) -> list[CellConfig]:
    """A model of your own (``hf:``, ``module:factory``, ``file.py:factory``, an entry point)
    has its own presets (``default``; an hf shape), not the suite's (``tiny``): where no
    ``--preset`` was given, its cells take its first preset (duplicates dropped). Its code is
    first run in a bounded child (``check_workload``)."""
    from shardbench.harness.bounded import check_workload
    from shardbench.harness.validate import check_timeout
    from shardbench.models.registry import get_workload
    from shardbench.models.specs import is_spec

    out: dict[tuple, CellConfig] = {}
    for c in cells:
        if is_spec(c.workload):
            check_timeout(c.timeout_s)
            check_workload(c.workload, None, timeout_s=c.timeout_s)
            if c.preset not in get_workload(c.workload).presets:
                c = replace(c, preset=next(iter(get_workload(c.workload).presets)))
        out.setdefault(c.key(), c)
    return list(out.values())


def run_name(suite: str, cells: Sequence[CellConfig], *, scaling: bool = False) -> str:
    """A run's default name, which its id and folder carry: the suite's where every cell is one
    of the suite's own (flags that narrow the suite, repeat it or set it against N = 1 keep its
    name, and runs of the same cells keep comparing under one name), else the workloads that
    ran: flags that replaced the suite's lists measured something the suite never named."""
    workloads = list(dict.fromkeys(c.workload for c in cells))
    spec = override(load_suite(suite), scaling=scaling).for_devices(cuda_devices())
    from shardbench.harness.shard_width import fit_shard_groups

    own = {_identity(c) for c in fit_shard_groups(spec.cells())[0] if c.workload in workloads}
    if {_identity(c) for c in cells} <= own:
        return safe_name(spec.name)
    labels = [workload_label(w) for w in workloads]
    shown = labels if len(labels) <= 3 else [*labels[:2], f"and-{len(labels) - 2}-more"]
    return safe_name("-".join(shown))


def workload_label(workload: str) -> str:
    """A workload as a word of a run's name: a built-in or registered name as it is,
    ``hf:GPT2LMHeadModel`` its class, and a factory or LightningModule in a file or a module by
    the file's stem or the module's last part (``examples/mymodel.py:factory`` -> ``mymodel``):
    the factory's own name is often just ``factory``, the file's says which model."""
    if workload.startswith("hf:"):
        return workload.removeprefix("hf:")
    where, sep, attr = workload.removeprefix("lightning:").rpartition(":")
    if not sep:
        return workload
    stem = where.replace("\\", "/").rsplit("/", 1)[-1]
    stem = stem.removesuffix(".py") if stem.endswith(".py") else stem.rsplit(".", 1)[-1]
    return stem or attr


def _identity(cell: CellConfig) -> CellKey:
    """The cell across runs, its repeat aside, read as a run plans it: a strategy's alias as its
    name, a planned world as simulated (``plan_cells``), a model of one's own at its own preset
    where the suite's is not one of them (``own_presets``)."""
    from shardbench.models.registry import get_workload
    from shardbench.models.specs import is_spec
    from shardbench.strategies.registry import canonical_name

    try:
        strategy = canonical_name(cell.strategy)
    except ValueError:
        strategy = cell.strategy
    preset = cell.preset
    if is_spec(cell.workload):
        presets = get_workload(cell.workload).presets
        preset = preset if preset in presets else next(iter(presets))
    return replace(cell, strategy=strategy, preset=preset, simulate=cell.simulate or cell.fake).key()[0]


def check_run_name(name: str) -> str:
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise UsageError(f"--name {name!r}: use letters, digits, '-' and '_' only")
    return name
