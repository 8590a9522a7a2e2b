"""The nightly gate's power, measured: N same-code nights and N nights with one strategy slowed
on purpose, each a full ``shardbench nightly`` against the committed baseline, into a scratch
results home (the checkout's history and runs are left alone).

    .venv/bin/python scripts/gate_power.py [--nights 5] [--frac 0.15] [--strategy zero2]
        [--suite nightly-cpu] [--home results] [--scratch DIR] [--fresh-baseline 3]
    .venv/bin/python scripts/gate_power.py --from DIR     # the figures of a scratch already run

``--fresh-baseline R`` first runs the suite R times and saves them over this machine's records
of a copy of the baseline (``baseline save --add``, in the scratch home): the nights are then
judged against a baseline measured with the suite's steps as they are, and the script prints
the command that copies it into the checkout.

An injected night sets ``SHARDBENCH_FAULT=slow:frac=F:strategy=S`` (``harness/faults.py``): every
step of that strategy's cells sleeps F times the step's own time, so its step time, and its
ratio to ddp, grow by F. Nights alternate, same code then injected, so a drift of the machine
over the measurement hits both kinds alike. The table gives, per night, its kind, nightly's exit
code (0 clean, 1 regression), the strategy's combined change over its cells with the band it was
judged by and the least slowdown the night could have caught, the night's wall time and the
machine's load average over the 5 minutes before it ended (a loaded machine's nights say
little), and the cells judged beyond their own band. A night fails (exit 1) on either test:
the strategy-wide line, or one of the strategy's cells alone beyond its band. The gate is good
enough when every same-code night exits 0 with no strategy line and no cell beyond its band,
and at least 4 in 5 injected nights exit 1 naming the slowed strategy; the last lines count
each, and which test caught the night.

Run it on a quiet machine: every night's step times are measured, and a busy neighbour is noise
in the very figures this measures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shardbench.harness.config import load_suite

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nights", type=int, default=5, help="nights of each kind (default 5)")
    ap.add_argument("--frac", type=float, default=0.15, help="the injected slowdown (default 0.15)")
    ap.add_argument("--strategy", default="zero2", help="the strategy slowed (default zero2)")
    ap.add_argument("--suite", default="nightly-cpu")
    ap.add_argument("--home", type=Path, default=REPO / "results", help="results home holding the baseline")
    ap.add_argument("--scratch", type=Path, help="where the nights go (default: a new temporary directory)")
    ap.add_argument(
        "--from", dest="done", type=Path, help="print the figures of this scratch's nights, run before"
    )
    ap.add_argument(
        "--fresh-baseline",
        type=int,
        default=0,
        metavar="R",
        help="first save a baseline of R runs (default 0: none)",
    )
    args = ap.parse_args(argv)
    if args.nights < 1 or not 0 < args.frac <= 10 or args.fresh_baseline < 0:
        ap.error("--nights must be >= 1, --frac in (0, 10] and --fresh-baseline >= 0")
    if args.done is not None:
        return _summary(
            args, [_read_night(args, args.done, i, injected) for i, injected in _nights(args.done)]
        )
    baselines = args.home / "baselines"
    if not baselines.is_dir():
        ap.error(f"--home {args.home}: no baselines/ in it")
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="gate-power-"))
    if scratch.exists() and any(scratch.iterdir()):
        ap.error(f"--scratch {scratch}: not empty; the nights need a directory of their own")
    scratch.mkdir(parents=True, exist_ok=True)
    shutil.copytree(baselines, scratch / "baselines")
    fault = f"slow:frac={args.frac:g}:strategy={args.strategy}"
    print(f"gate power: {args.suite}, {args.nights} same-code and {args.nights} injected ({fault}) nights")
    print(f"scratch: {scratch}", flush=True)
    if args.fresh_baseline and _fresh_baseline(args, scratch) != 0:
        return 1
    rows = []
    for i in range(args.nights):
        for injected in (False, True):
            rows.append(_night(args, scratch, i, injected, fault))
            print(_row(rows[-1]), flush=True)
    return _summary(args, rows)


def _nights(scratch: Path) -> list[tuple[int, bool]]:
    """The nights a scratch holds, in the order they ran."""
    found = [p.name.split("-") for p in (scratch / "nights").glob("*-*") if p.is_dir()]
    return sorted((int(night), kind == "injected") for night, kind in found)  # same code first


def _summary(args: argparse.Namespace, rows: list[dict]) -> int:
    print()
    print(_table(rows))
    same = [r for r in rows if not r["injected"]]
    slowed = [r for r in rows if r["injected"]]
    clean = sum(r["code"] == 0 for r in same)
    print(f"same-code nights clean: {clean} of {len(same)}")
    false_alarms = [line for r in same for line in r.get("beyond", [])]
    lines = sum(r.get("lines", 0) for r in same)
    print(
        f"same-code strategy lines beyond their band, either direction: {len(false_alarms)} of {lines}"
        + (f" ({'; '.join(false_alarms)})" if false_alarms else "")
    )
    cells_off = [cell for r in same for cell in r.get("cells_beyond", [])]
    print(
        f"same-code cells beyond their band, either direction: {len(cells_off)}"
        + (f" ({'; '.join(cells_off)})" if cells_off else "")
    )
    by_line = sum(r["code"] == 1 and r["regressed"] for r in slowed)
    by_cells = sum(r["code"] == 1 and _names_strategy(r, args.strategy) for r in slowed)
    named = f"exit 1 naming {args.strategy}, by its line or its cells"
    print(f"injected nights caught ({named}): {by_cells} of {len(slowed)}")
    print(f"  of which by the strategy-wide line ({args.strategy} regressed): {by_line} of {len(slowed)}")
    walls = sorted(r["wall_s"] for r in rows if r["wall_s"] is not None)
    if walls:
        print(f"night wall time: {walls[0]:.0f}-{walls[-1]:.0f} s (median {walls[len(walls) // 2]:.0f} s)")
    return 0


def _names_strategy(row: dict, strategy: str) -> bool:
    """Whether the night's regressions name ``strategy``: its line, or one of its cells."""
    return row["regressed"] or any(cell.split("/")[2] == strategy for cell in row.get("cells_regressed", []))


def _env(scratch: Path) -> dict[str, str]:
    """This environment without a fault, with the scratch as the results home of everything a
    command writes (its peak cache too)."""
    return {k: v for k, v in os.environ.items() if k != "SHARDBENCH_FAULT"} | {
        "SHARDBENCH_HOME": str(scratch)
    }


def _fresh_baseline(args: argparse.Namespace, scratch: Path) -> int:
    """R runs of the suite, saved over this machine's records of the scratch's baseline copy."""
    runs = []
    for i in range(args.fresh_baseline):
        out = scratch / "baseline-runs" / f"{i:02d}"
        started = time.monotonic()
        command = [sys.executable, "-m", "shardbench", "run", "--suite", args.suite, "--name", args.suite]
        code = _logged(
            [*command, "--out", str(out)], scratch / "baseline-runs" / f"{i:02d}.log", _env(scratch)
        )
        print(f"baseline run {i}: exit {code}, {time.monotonic() - started:.0f} s ({out})", flush=True)
        if code != 0:
            return code
        runs.append(str(out))
    save = [sys.executable, "-m", "shardbench", "baseline", "save", *runs, "--as", args.suite, "--add"]
    code = _logged(save, scratch / "baseline-runs" / "save.log", _env(scratch))
    saved = scratch / "baselines" / load_suite(args.suite).device
    files = f"{saved}/{args.suite}.jsonl {saved}/{args.suite}.manifest.json"
    print(f"baseline saved (exit {code}): {saved}/{args.suite}.jsonl; to keep it:")
    print(f"    cp {files} {args.home}/baselines/{saved.name}/")
    return code


def _logged(command: list[str], log: Path, env: dict[str, str]) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        return subprocess.run(command, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO).returncode


def _night(args: argparse.Namespace, scratch: Path, i: int, injected: bool, fault: str) -> dict:
    kind = "injected" if injected else "same"
    out = scratch / "nights" / f"{i:02d}-{kind}"
    env = _env(scratch)
    if injected:
        env["SHARDBENCH_FAULT"] = fault
    command = [
        sys.executable, "-m", "shardbench", "nightly", "--suite", args.suite,
        "--out", str(out),
        "--history", str(scratch / "history" / f"{args.suite}.jsonl"),
        "--tag", f"gate_power={kind}",
    ]  # fmt: skip
    started = time.monotonic()
    log = scratch / "nights" / f"{i:02d}-{kind}.log"
    code = _logged(command, log, env)
    row = {"code": code, "wall_s": time.monotonic() - started, "load": os.getloadavg()[1], "log": log}
    return _judged(args, out, i, injected, row)


def _read_night(args: argparse.Namespace, scratch: Path, i: int, injected: bool) -> dict:
    """A night of a scratch run before, from its ``compare.json`` (its wall time and load were
    printed as it ran, not kept)."""
    out = scratch / "nights" / f"{i:02d}-{'injected' if injected else 'same'}"
    try:
        code = json.loads((out / "compare.json").read_text())["exit_code"]
    except (OSError, ValueError, KeyError):
        code = None
    return _judged(args, out, i, injected, {"code": code, "wall_s": None, "load": None})


def _judged(args: argparse.Namespace, out: Path, i: int, injected: bool, row: dict) -> dict:
    """A night's row: what ran, and how its comparison judged the strategy and the cells."""
    row = {"night": i, "injected": injected, **row}
    try:
        compared = json.loads((out / "compare.json").read_text())
        strategies = compared["strategies"]
        ours = next(s for s in strategies if s["strategy"] == args.strategy)
    except (OSError, ValueError, KeyError, StopIteration):
        return {**row, "regressed": False, "change": None, "band": None, "detectable": None, "lines": 0}
    judged = [(c["cell"], c["verdict"]) for c in compared.get("cells", [])]
    return {
        **row,
        "lines": len(strategies),
        "beyond": _beyond_band(strategies),
        "cells_beyond": [
            f"{cell} ({verdict})" for cell, verdict in judged if verdict in ("regressed", "improved")
        ],
        "cells_regressed": [cell for cell, verdict in judged if verdict == "regressed"],
        "regressed": ours["regressed"],
        "change": ours["change_pct"],
        "band": ours["bound_pct"],
        "detectable": ours["detectable_pct"],
    }


def _beyond_band(strategies: list[dict]) -> list[str]:
    """The strategy-wide lines judged beyond their band, either direction (the verdict, which
    compares in logs): a same-code night's false alarms, slower or faster."""
    return [
        f"{s['strategy']} {s['change_pct']:+.1f}% ({s['verdict']})"
        for s in strategies
        if s.get("verdict") in ("regressed", "improved")
    ]


def _cells(r: dict) -> list[str]:
    pct = lambda v, sign="": "-" if v is None else f"{v:{sign}.1f}%"  # noqa: E731
    return [
        str(r["night"]),
        "injected" if r["injected"] else "same code",
        "-" if r["code"] is None else str(r["code"]),
        pct(r["change"], "+"),
        pct(r["band"]),
        pct(r["detectable"]),
        str(len(r.get("cells_beyond", []))),
        "-" if r["wall_s"] is None else f"{r['wall_s']:.0f} s",
        "-" if r["load"] is None else f"{r['load']:.1f}",
    ]


HEAD = ["night", "kind", "exit", "change", "band +/-", "could detect >=", "cells beyond", "wall", "load"]


def _row(r: dict) -> str:
    return ", ".join(f"{h}: {c}" for h, c in zip(HEAD, _cells(r), strict=True)) + f" ({r['log']})"


def _table(rows: list[dict]) -> str:
    lines = [HEAD, *(_cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEAD))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines)


if __name__ == "__main__":
    sys.exit(main())
