"""``shardbench list`` and ``shardbench env``: what this installation and machine offer.

``list`` reads parameter counts from preset shapes and strategies from their catalog: no model
is built and torch is not imported, so it answers in well under 2 s.
"""

from __future__ import annotations

import argparse
import json
import sys

from shardbench.harness.config import load_suite, suite_names


def add_listing_parsers(sub: argparse._SubParsersAction) -> None:
    lst = sub.add_parser("list", help="workloads (presets, parameter counts), strategies, suites")
    lst.add_argument("--json", action="store_true", help="machine-readable output")
    env = sub.add_parser(
        "env",
        help="versions and devices of this machine, the peak FLOP/s MFU is set against (a CUDA "
        "device's datasheet; the CPU's GEMM probe), and every probe the step-time model cached in "
        "the results home (gloo network, optimizer update, step replays), each with when and "
        "under what load it was measured",
    )
    env.add_argument(
        "--remeasure",
        action="store_true",
        help="drop every cached probe of this machine (GEMM peak, gloo network, optimizer update, "
        "step replays) and measure the peak again now; the others are measured when next needed",
    )


def listing() -> dict:
    """Everything ``list`` shows, read from declarations: no strategy or model library is
    imported (the strategy catalog and the workloads' preset modules are torch-free)."""
    from shardbench.models.registry import preset_param_counts, size_family_help, workload_names
    from shardbench.strategies.registry import missing_packages, strategy_cards

    workloads: dict[str, dict] = {}
    for name in workload_names():
        try:
            counts, sizes = preset_param_counts(name), size_family_help(name)
        except ValueError as e:  # a package's registered workload that does not load: say so
            workloads[name] = {"presets": {}, "sizes": None, "error": str(e)}
            continue
        workloads[name] = {"presets": {p: {"params": n} for p, n in counts.items()}, "sizes": sizes}
    strategies = {
        c.name: {
            "aliases": list(c.aliases),
            "description": c.description,
            "shards_optimizer_state": c.sharding.optimizer_state,
            "shards_gradients": c.sharding.gradients,
            "shards_parameters": c.sharding.parameters,
            "simulatable": c.simulatable,
            "shard_group": c.shard_group,
            "cuda_only": c.cuda_only,
            "available": not missing_packages(c.name),
            "extra": c.extra,
            "deviations": c.deviations,
        }
        for c in strategy_cards()
    }
    suites = {n: load_suite(n).description for n in suite_names()}
    from shardbench.models.specs import FORMS

    return {"workloads": workloads, "workload_forms": FORMS, "strategies": strategies, "suites": suites}


def cmd_list(args: argparse.Namespace) -> int:
    data = listing()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print("workloads: presets (parameters)")
    for name, w in data["workloads"].items():
        presets = ", ".join(f"{p} ({v['params'] / 1e6:.1f}M)" for p, v in w["presets"].items())
        print(f"  {name}: {presets or 'error: ' + w.get('error', '')}")
        if w["sizes"]:
            print(f"    any size: {w['sizes']}")
    print(f"  and your own: {data['workload_forms']} (docs/own-models.md)")
    print("strategies:")
    for name, s in data["strategies"].items():
        alias = f" (alias: {', '.join(s['aliases'])})" if s["aliases"] else ""
        where = " [CUDA only]" if s["cuda_only"] else ""
        missing = "" if s["available"] else f" [not installed: the {s['extra']!r} extra]"
        print(f"  {name}{alias}: {s['description']}{where}{missing}")
    print("suites:")
    for name, desc in data["suites"].items():
        print(f"  {name}: {desc}")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    import torch

    from shardbench.prediction.probe_cache import listing as probe_listing
    from shardbench.records import capture_env

    if getattr(args, "remeasure", False):
        from shardbench.prediction.probe_cache import forget_all

        for dropped in forget_all():
            print(f"shardbench env: dropped {dropped}", file=sys.stderr)
    env = capture_env("cuda" if torch.cuda.is_available() else "cpu")
    env["cuda_available"] = torch.cuda.is_available()
    env["gloo_available"] = torch.distributed.is_gloo_available()
    env["nccl_available"] = torch.distributed.is_nccl_available()
    env["peak_flops"] = peak_flops(env)
    env["probes"] = probe_listing()
    print(json.dumps(env, indent=2))
    return 0


def peak_flops(env: dict) -> dict:
    """What MFU is set against on this machine: each CUDA device's datasheet peaks, and this
    CPU's measured peaks cached in the results home (a record's threads and dtype pick one);
    the CPU's fp32 peak at a lone rank's threads is measured now when it was never measured."""
    import torch

    from shardbench.harness.config import threads_per_rank
    from shardbench.prediction.peaks import DTYPES, cache_file, datasheet_peak, measured_peak, read_cache
    from shardbench.records import capture_env

    out: dict = {"cache": str(cache_file())}
    if torch.cuda.is_available():
        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        out["cuda"] = {
            name: {d: p["flops_per_s"] if (p := datasheet_peak(name, d)) else None for d in DTYPES}
            for name in names
        }
    cpu = env["device_name"] if not torch.cuda.is_available() else capture_env("cpu")["device_name"]
    measured_peak("cpu", cpu, "fp32", threads_per_rank(1), torch_version=torch.__version__)
    out["cpu_measured"] = {
        key: {
            k: entry.get(k)
            for k in ("flops_per_s", "median_flops_per_s", "mad_flops_per_s", "measured_at", "load_per_core")
        }
        for key, entry in read_cache().items()
        if entry.get("device_name") == cpu and entry.get("torch") == torch.__version__
    }
    return out
