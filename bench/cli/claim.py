"""``shardbench claim``: parse and validate, then run ``shardbench.studies.claim``."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from shardbench.cli.common import (
    UsageError,
    add_model_config_args,
    add_reserve_argument,
    add_root_argument,
    csv_list,
    model_config_preset,
    require_cuda_if,
    require_env_of,
    reserve_policy,
)
from shardbench.harness.config import DEVICES
from shardbench.precision import PRECISIONS
from shardbench.studies.claim_specs import CLAIMS_DIR as CLAIMS_DIR  # where a claim goes by default
from shardbench.wording import program

if TYPE_CHECKING:
    from shardbench.records import Record
    from shardbench.studies.claim_specs import ClaimSpec


def add_claim_parser(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "claim",
        help="does zero2 halve per-rank memory or double the trainable model vs ddp? a verdict per workload",
        description="Measure the claim for every workload of the spec: per-rank peak of ddp, zero2 "
        "(and zero3) at a simulated N, real-rank step time, and the largest model within the budget. "
        "Writes records.jsonl, report.md, charts and index.html into results/claim/<spec>/ "
        f"({OUT_SUFFIXES}; --out to change). How long: the cpu spec takes about 2 hours on a "
        "2-core machine (the max-size searches are most of it; deepspeech2, which cannot be "
        "planned under FakeTensorMode, about half), the tiny spec under a minute; --resume "
        "continues a claim stopped part-way.",
    )
    _add_spec_arguments(c)
    _add_workload_arguments(c)
    _add_output_arguments(c)


def _add_spec_arguments(c: argparse.ArgumentParser) -> None:
    """Which spec runs, and what of it the flags change."""
    from shardbench.studies.claim_specs import SPECS

    def per_spec(field: str) -> str:  # "cpu 8, cuda 8, tiny 4": from the specs, never a stale copy
        return ", ".join(f"{name} {getattr(spec, field)}" for name, spec in SPECS.items())

    c.add_argument("--device", choices=DEVICES, help="cpu or cuda (default cpu); picks the spec of that name")
    c.add_argument("--spec", choices=list(SPECS), help="what to run (default: the device's); tiny = a test")
    c.add_argument(
        "--world-size",
        type=int,
        help=f"simulated world size for memory (default: the spec's: {per_spec('world_size')})",
    )
    c.add_argument(
        "--budget",
        help=f"per-rank budget for the max-size search (default: the spec's: {per_spec('budget')})",
    )
    c.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="every cell's precision (default fp32); away from fp32 the report goes to "
        "results/claim/<spec>-<precision>",
    )
    add_reserve_argument(c)


def _add_workload_arguments(c: argparse.ArgumentParser) -> None:
    """Which workloads are measured: some of the spec's, your own, the peers beside them."""
    from shardbench.studies.claim_specs import OWN_BATCH

    c.add_argument(
        "--workload",
        type=csv_list(str),
        help="only these of the spec's workloads; or your own (hf:<Arch>, module:factory, file.py:factory, "
        "lightning:module:LitClass), "
        "measured like them at --model-config's shape (its report goes to results/claim/<spec>-<workload>)",
    )
    add_model_config_args(c)
    c.add_argument(
        "--batch-size",
        type=int,
        help=f"per-rank batch of your own workloads (the spec's workloads keep theirs; default {OWN_BATCH})",
    )
    c.add_argument(
        "--peers",
        action="store_true",
        help="also measure the peers: torch-zero1 and fsdp2-zero2 at the simulated N (on by default "
        "for cuda), and where the spec has real ranks, fairscale-zero2 (OSS + ShardedDataParallel, "
        "Lightning's ddp_sharded) and deepspeed-zero2 on them, beside ddp and zero2 at that N",
    )


def _add_output_arguments(c: argparse.ArgumentParser) -> None:
    """Where the report goes, what it is built from, and the baseline it is gated against."""
    c.add_argument(
        "--out", type=Path, help=f"report directory (default results/claim/<spec>, {OUT_SUFFIXES})"
    )
    c.add_argument(
        "--from-records",
        action="store_true",
        help="measure nothing: rebuild report.md and the charts from the directory's records.jsonl "
        "(after a report change, or a claim stopped part-way: what has no records is 'not measured')",
    )
    c.add_argument(
        "--resume",
        action="store_true",
        help="keep the directory's ok cells and measure only the rest (a claim stopped part-way, "
        "or a spec that gained a strategy); the report covers every workload",
    )
    c.add_argument(
        "--baseline",
        help=f"saved baseline ({program()} baseline save results/claim/cpu --as NAME): exit 1 when a "
        "workload whose claim held there no longer holds",
    )
    add_root_argument(c)


#: how the default folder's name grows (``claim_specs.default_out``), as the help says it
OUT_SUFFIXES = "-<workloads> added for workloads of your own, -<precision> away from fp32"
#: peers a simulated rank can stand for, and those measured on real ranks (the 'peers' extra)
SIMULATED_PEERS = ("torch-zero1", "fsdp2-zero2")
REAL_PEERS = ("fairscale-zero2", "deepspeed-zero2")


def real_peers(spec: ClaimSpec) -> tuple[str, ...]:
    """The real-rank peers of ``--peers`` for ``spec``: none where it has no real ranks (one GPU);
    ValueError in one line where one is not installed. A peer that trains the spec's precision
    only on CUDA (FairScale's fp16 scaler) is left out, in one line saying why."""
    from shardbench.strategies.registry import check_runnable, strategy_card

    if not spec.timing_world_size:
        return ()
    kept = []
    for name in REAL_PEERS:
        check_runnable(name, spec.device)
        card = strategy_card(name)
        if spec.precision == "fp16" and card.fp16_needs_cuda and spec.device != "cuda":
            print(f"shardbench claim: {name} left out: it trains fp16 only on CUDA ({card.fp16_needs_cuda})")
            continue
        kept.append(name)
    return tuple(kept)


def cmd_claim(args: argparse.Namespace) -> int:
    from shardbench.studies.claim_specs import default_out

    spec, own = _asked_spec(args)
    if args.root is not None and not args.baseline:
        raise UsageError(
            "--root is where --baseline is looked up; without --baseline claim reads none: drop --root"
        )
    baseline = _baseline(args.baseline, spec, args.root) if args.baseline else None
    require_cuda_if(
        spec.device, asked=f"spec {spec.name!r} (on cuda)", instead="--device cpu, or --spec tiny"
    )
    out = args.out or default_out(spec)
    from shardbench.harness.validate import check_output_dir

    try:
        check_output_dir(out)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.from_records and args.resume:
        raise UsageError("--from-records measures nothing and --resume measures the rest: pick one")
    if args.from_records:
        report, results = _rebuild(spec, out)
    else:
        report, results = _measure(spec, out, args, own)
    code = _gate(report, spec, baseline, args.baseline, results)
    print(report.read_text())
    _say_measured(out, report)
    return code


def _asked_spec(args: argparse.Namespace) -> tuple[ClaimSpec, list[str]]:
    """The spec the flags ask for, and the names of your own workloads in it."""
    from shardbench.studies.claim_specs import SPECS
    from shardbench.studies.maxsize import parse_budget

    spec = SPECS[args.spec or args.device or "cpu"]
    if args.device and args.device != spec.device:
        raise UsageError(f"spec {spec.name!r} runs on {spec.device}, not {args.device}")
    try:
        if args.budget:
            parse_budget(args.budget)
            spec = replace(spec, budget=args.budget)
        if args.reserve is not None:
            fixed = reserve_policy(args, parse_budget(spec.budget), spec.device).fixed
            spec = replace(spec, reserve_bytes=fixed)
        if args.precision:
            spec = replace(spec, precision=args.precision)
        if args.peers:
            spec = replace(spec, peers=SIMULATED_PEERS, real_peers=real_peers(spec))
        if args.world_size is not None:
            if args.world_size < 2:
                raise ValueError(f"world size must be >= 2 to shard anything, got {args.world_size}")
            spec = replace(spec, world_size=args.world_size)
        return _with_own_workloads(spec, args)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _measure(spec: ClaimSpec, out: Path, args: argparse.Namespace, own: list[str]) -> tuple[Path, list]:
    """Run the claim (the rest of it, with ``--resume``) and write its report."""
    from shardbench.cli.first_use import deepspeed_build_note
    from shardbench.report.claim_report import write_claim_report
    from shardbench.studies.claim import claim

    workloads = None if own or not args.workload else tuple(args.workload)
    if note := deepspeed_build_note(spec.real_peers, spec.device):
        print(note, file=sys.stderr)
    done = claim(spec, out_dir=out, workloads=workloads, resume=args.resume, job_cells=args.job_cells)
    report = write_claim_report(spec, done.results, out, done.wall_s, resumed=done.resumed)
    return report, done.results


def _gate(report: Path, spec: ClaimSpec, baseline: list[Record] | None, name: str, results: list) -> int:
    """1 where a workload whose claim held in the baseline no longer holds (said in the report's
    gate section), else 0; 0 without a baseline."""
    if baseline is None:
        return 0
    from shardbench.report.claim_report import gate_section
    from shardbench.studies.claim_gate import compare_claims

    changes = compare_claims(spec, baseline, results)
    with report.open("a") as f:
        f.write("\n" + gate_section(name, changes))
    return 1 if any(c.regressed for c in changes) else 0


def _say_measured(out: Path, report: Path) -> None:
    """After the report: how far the predictions were from the measurements, where the report
    is, and a warning when nothing was measured."""
    from shardbench.prediction.accuracy import error_line
    from shardbench.records import none_ok, read_records

    measured = read_records([out / "records.jsonl"]) if (out / "records.jsonl").exists() else []
    if line := error_line(measured):
        print(line)
    print(f"report: {report}")
    if failed := none_ok(measured):  # every verdict "not measured": said once, not only per workload
        print(f"shardbench claim: warning: {failed}; the report has no measured verdict", file=sys.stderr)


def _with_own_workloads(spec: ClaimSpec, args: argparse.Namespace) -> tuple[ClaimSpec, list[str]]:
    """The spec with only the workloads ``--workload`` names, those of your own added (measured
    like the spec's, at ``--model-config``'s shape and ``--batch-size``), and the names of your
    own; ValueError for a name that is neither the spec's nor a workload spec. The spec is what
    is measured, reported, rebuilt and judged, so it holds exactly what was asked for."""
    from shardbench.harness.bounded import check_workload
    from shardbench.harness.config import DEFAULT_TIMEOUT_S
    from shardbench.models.registry import get_workload
    from shardbench.models.specs import is_spec
    from shardbench.studies.claim_specs import OWN_BATCH, ClaimWorkload

    names = [w.name for w in spec.workloads]
    own = [w for w in args.workload or () if w not in names and is_spec(w)]
    for w in args.workload or ():
        if w not in names and w not in own:
            raise ValueError(
                f"unknown workload {w!r} for spec {spec.name!r}; allowed: {', '.join(names)}, or your "
                "own (hf:<Arch>, module:factory, file.py:factory, lightning:module:LitClass)"
            )
    try:
        preset = model_config_preset(args, own or None)
    except UsageError as e:
        raise ValueError(str(e)) from None
    kept = tuple(w for w in spec.workloads if not args.workload or w.name in args.workload)
    if not own:
        if args.batch_size is not None:  # the spec's workloads keep their own batch
            raise ValueError(
                f"--batch-size sets the batch of your own workloads (--workload hf:<Arch>, file.py:factory, "
                f"...); the spec's workloads ({', '.join(names)}) keep theirs: drop --batch-size"
            )
        return replace(spec, workloads=kept), []
    if args.batch_size is None:
        args.batch_size = OWN_BATCH
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    added = []
    for name in own:
        check_workload(name, preset, timeout_s=DEFAULT_TIMEOUT_S)  # its code: in a bounded child first
        workload = get_workload(name)
        chosen = preset or next(iter(workload.presets))
        workload.check_preset(chosen)
        # no size family (a factory without ModelSpec(depth=...)): the search probes the one
        # shape, and the report says it found no boundary
        ladder = None if workload.size_family(chosen) is not None else (chosen,)
        added.append(ClaimWorkload(name, chosen, args.batch_size, ladder=ladder))
    return replace(spec, workloads=(*kept, *added)), own


def _rebuild(spec: ClaimSpec, out: Path) -> tuple[Path, list]:
    """The claim's report from the records already in ``out``, each variant without records
    listed as not measured."""
    from shardbench.records import read_records
    from shardbench.report.claim_report import write_claim_report
    from shardbench.studies.claim_result import every_variant, results_from_records

    if not (out / "records.jsonl").is_file():
        raise UsageError(f"--from-records: no {out / 'records.jsonl'} to rebuild the report from")
    found = {r.workload.label: r for r in results_from_records(spec, read_records([out / "records.jsonl"]))}
    results = every_variant(spec, found)
    return write_claim_report(spec, results, out, wall_s=None), results


def _baseline(name: str, spec: ClaimSpec, home: Path | None) -> list[Record]:
    """The baseline's records, checked before anything runs: it must hold this spec's claim."""
    from shardbench.records import load_records
    from shardbench.studies.baselines import baselines_dir, find_baseline
    from shardbench.studies.claim_result import results_from_records

    try:
        records = load_records(find_baseline(name, device=spec.device, root=baselines_dir(home)))
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not results_from_records(spec, records):
        raise UsageError(
            f"baseline {name!r} holds no records of claim spec {spec.name!r} at {spec.precision}"
        )
    require_env_of(records, spec.device, f"baseline {name!r}", allow=False)
    return records
