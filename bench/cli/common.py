"""What every ``shardbench`` subcommand shares: the user-error type and list parsing."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardbench.studies.plan_reserve import ReservePolicy

DEFAULT_RUNS_DIR = Path("results/runs")


def default_out(source: Path, command: str) -> Path:
    """Where ``report`` and ``compare`` write when not told: beside the records of a run directory
    (a run's report and compare files belong with it), and for any other records file (a saved
    baseline, a file of one's own) a folder of its own under ``DEFAULT_RUNS_DIR``, which git
    ignores: never the directory the command is run from, nor the folder a baseline is kept in."""
    from shardbench.paths import path_component

    if source.is_dir():
        return source
    if source.name == "records.jsonl":
        return source.parent
    return DEFAULT_RUNS_DIR / f"{command}-{path_component(source.stem, what='records file name')}"


def require_cuda_if(
    device: str, *, instead: str, asked: str = "--device cuda", planned: bool = False
) -> None:
    """Refuse CUDA (``asked``: how the command line asked for it) on a machine without CUDA,
    before anything starts, unless every cell is ``planned`` (``--fake``): a plan for CUDA runs
    on the CPU with CUDA's kernels. ``instead`` is what the calling command accepts that runs
    here: commands differ in their flags, and a refusal that names a flag its command lacks
    sends the user to a second error."""
    if device == "cuda" and not planned:
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"{asked} requested but CUDA is not available here; use {instead}")


def add_root_argument(parser: argparse.ArgumentParser) -> None:
    """``--root``: where baselines and histories are read and written (``paths.results_home``)."""
    parser.add_argument(
        "--root",
        type=Path,
        help="folder of saved baselines (baselines/) and nightly histories (history/) "
        "(default: $SHARDBENCH_HOME, else ./results)",
    )


def cuda_devices() -> int:
    """CUDA devices on this machine (0 without CUDA): which suite strategies can run for real."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class UsageError(ValueError):
    """A user mistake: reported in one line with exit code 2."""


def csv_list(kind: type) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        items = [t.strip() for t in text.split(",")]
        if not any(items):
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        if not all(items):
            raise argparse.ArgumentTypeError(f"an empty item in {text!r}: expected comma-separated values")
        try:
            return tuple(kind(t) for t in items)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {kind.__name__}s, got {text!r}"
            ) from None

    return parse


def csv_choices(allowed: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    """A comma-separated list whose every item is one of ``allowed`` (argparse's ``choices``
    for a list: a wrong item is refused by the parser, naming what is allowed)."""
    parse_list = csv_list(str)

    def parse(text: str) -> tuple[str, ...]:
        items = parse_list(text)
        bad = [t for t in items if t not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(
                f"invalid choice: {bad[0]!r} (choose from {', '.join(allowed)}, comma-separated)"
            )
        return items

    return parse


def choices_metavar(allowed: Sequence[str]) -> str:
    """``{fp32,bf16}[,...]``: the usage line of a ``csv_choices`` option."""
    return "{" + ",".join(allowed) + "}[,...]"


def tag_pair(text: str) -> tuple[str, str]:
    """``key=value`` for ``--tag``: a key of letters, digits, '-', '_' or '.', any value."""
    key, sep, value = text.partition("=")
    if not sep or not key or not key.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE with a key of letters, digits, '-', '_' or '.', got {text!r}"
        )
    return key, value


def require_env_of(baseline: list, device: str, label: str, *, allow: bool) -> None:
    """Refuse, before anything runs, to measure against ``baseline`` on a machine whose torch,
    device, record schema or rank binding differ from its records' (``machines.ENV_KEYS``:
    compare would refuse afterwards); of a baseline holding several machines, the records of
    this one are checked."""
    from types import SimpleNamespace

    from shardbench.core_binding import RUN_FREE
    from shardbench.records import SCHEMA, capture_env
    from shardbench.studies.machines import ENV_KEYS, env_changes, for_machine

    here = SimpleNamespace(env=capture_env(device), schema=SCHEMA, device=device)  # shaped like a record
    changed = env_changes(for_machine(baseline, [here]), [here])
    if changed and not allow:
        listed = "; ".join(f"{k}: {b} there, {c} here" for k, (b, c) in changed.items())
        raise UsageError(
            f"this machine differs from {label} ({listed}); its numbers would not compare. Save a "
            f"baseline here, or pass --allow-env-change ({', '.join(ENV_KEYS)} must match"
            + (f"; {RUN_FREE}" if "rank_binding" in changed else "")
            + ")"
        )


def add_model_config_args(parser: argparse.ArgumentParser) -> None:
    """``--model-config`` and ``--seq-len``: the shape of a workload of your own."""
    parser.add_argument(
        "--model-config",
        metavar="KEY=VALUE,...",
        action="append",
        help="your own workload's shape: for hf:<Arch>, overrides of the architecture's config class, "
        "e.g. hidden_size=2048,num_hidden_layers=16,num_attention_heads=16 (default: the class's "
        "defaults); for a module:factory or file.py:factory, keyword arguments of the factory. "
        "Given more than once, the keys of all are used (a key given twice is refused)",
    )
    parser.add_argument("--seq-len", type=int, help="hf:<Arch> workloads: tokens per sample (default 128)")


def model_config_preset(args: argparse.Namespace, workloads: Sequence[str] | None) -> str | None:
    """The preset ``--model-config``/``--seq-len`` name (``models/presets/config_string.py``),
    or None if neither is given; UsageError if they are given with ``--preset``, for a built-in
    workload, or ``--seq-len`` for a workload not ``hf:``."""
    config, seq_len = getattr(args, "model_config", None), getattr(args, "seq_len", None)
    if config is None and seq_len is None:
        return None
    from shardbench.models.specs import is_spec

    flags = "--model-config/--seq-len"
    if getattr(args, "preset", None):
        raise UsageError(f"{flags} write the preset of your own workload: give them or --preset, not both")
    if not workloads or (others := [w for w in workloads if not is_spec(w)]):
        named = ", ".join(others) if workloads else "none given"
        raise UsageError(
            f"{flags} shape your own workloads (hf:<Arch>, module:factory, file.py:factory, "
            f"lightning:module:LitClass); not {named} "
            "(built-in workloads take --preset)"
        )
    if seq_len is not None and (others := [w for w in workloads if not w.startswith("hf:")]):
        raise UsageError(f"--seq-len applies to hf:<Arch> workloads only; not to {', '.join(others)}")
    from shardbench.models.presets.config_string import format_model_config, parse_model_config

    try:
        values = parse_model_config(",".join(config or []))
    except ValueError as e:
        raise UsageError(str(e)) from None
    if seq_len is not None:
        values["seq_len"] = seq_len
    return format_model_config(values)


def add_reserve_argument(parser: argparse.ArgumentParser) -> None:
    """``--reserve``: the memory kept free beside each peak, the same for ``plan``, ``max-size``
    and ``claim`` (``bench/studies/plan_reserve.py``)."""
    parser.add_argument(
        "--reserve",
        help="memory per rank kept free beside the peak, e.g. 2GiB (default: 0 on the CPU; on CUDA "
        "the allocator's cache at the worst reserved/allocated ratio measured for the strategy, plus "
        "the CUDA context where measured: docs/measuring.md)",
    )


def reserve_policy(args: argparse.Namespace, budget: int, device: str | None = None) -> ReservePolicy:
    """The reserves ``--reserve`` asks for on ``device`` (default ``--device``;
    ``plan_reserve.policy``); ValueError when ``--reserve`` cannot be read or leaves nothing of
    the budget."""
    from shardbench.studies.maxsize import parse_size
    from shardbench.studies.plan_reserve import policy
    from shardbench.units import size_text

    fixed = None if args.reserve is None else parse_size(args.reserve, what="--reserve", zero=True)
    if fixed is not None and fixed >= budget:
        raise ValueError(f"--reserve {args.reserve} leaves nothing of --budget {size_text(budget)}")
    return policy(device or args.device, fixed=fixed)
