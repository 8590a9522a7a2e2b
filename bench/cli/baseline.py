"""``shardbench baseline save RUN [RUN ...] --as NAME``: commit runs' records as a named baseline.

The records and a manifest (who, when, git sha, environment) go to
``<root>/baselines/<device>/NAME.jsonl`` (``--root``, else ``$SHARDBENCH_HOME``, else
``./results``); ``compare``, ``nightly`` and ``claim`` accept ``NAME``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from shardbench.cli.common import UsageError, add_root_argument


def add_baseline_parser(sub: argparse._SubParsersAction) -> None:
    base = sub.add_parser("baseline", help="save a run as a named baseline (results/baselines/)")
    actions = base.add_subparsers(dest="action", required=True)
    save = actions.add_parser(
        "save", help="copy the records of RUN (one or more) to <root>/baselines/<device>/NAME.jsonl"
    )
    save.add_argument(
        "run",
        type=Path,
        nargs="+",
        help="run directories or records .jsonl files; several runs of the suite (e.g. three nights) "
        "give the time rule their run-to-run spread as noise",
    )
    save.add_argument("--as", dest="name", required=True, help="the baseline's name, e.g. nightly-cpu")
    save.add_argument("--force", action="store_true", help="replace an existing baseline of that name, whole")
    save.add_argument(
        "--add",
        action="store_true",
        help="add to an existing baseline: keep its records of other machines (processor, torch), "
        "replace this machine's; compare and nightly read the records of the machine they run on",
    )
    save.add_argument("--strict", action="store_true", help="refuse a line that is not a record (exit 2)")
    add_root_argument(save)


def cmd_baseline(args: argparse.Namespace) -> int:
    from shardbench.studies.baselines import baselines_dir, manifest_path, save_baseline

    try:
        root = baselines_dir(args.root)
        dest = save_baseline(
            args.run, args.name, root=root, force=args.force, add=args.add, strict=args.strict
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    except OSError as e:  # a full disk, a read-only folder: the old baseline is left as it was
        raise UsageError(f"cannot save baseline {args.name!r}: {e}") from None
    print(f"baseline {args.name!r}: {dest} (manifest: {manifest_path(dest)}); commit both")
    return 0
