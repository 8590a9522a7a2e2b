"""Check the per-tier communication bytes on a real job of two nodes: two torchrun agents here.

Starts two torchrun agents on this host (node ranks 0 and 1, two processes each, meeting by c10d
rendezvous at a free local port), so the job is two "nodes" of two ranks: LOCAL_WORLD_SIZE = 2.
The job runs ``python -m shardbench run`` over hybrid sharding at N = 4 with S = 2 (a shard group
per node) and S = 4 (over both nodes). Each record's ``comm_per_step.tiers`` (what rank 0's
collectives sent within its node and across nodes, counted as they were issued over gloo) is
then set beside ``predicted_comm.tiers`` (the hierarchical model of ``metrics.topology``).

Per cell and tier it prints the measured bytes (every kind, the buffers' broadcast and the
used-parameter flags included), the predicted ones, their ratio and whether they agree within
the tolerance (1%); then zero3's bytes across nodes at S = 2 over those at S = 4, measured
and predicted. Exits 1 on a miss, 2 if the job itself fails.

    .venv/bin/python scripts/two_node_tiers.py
    .venv/bin/python scripts/two_node_tiers.py --strategies zero3 --steps 1 --out /tmp/tiers

Not part of the test suite: four ranks and two agents on a two-core machine take a minute or
more, and the same cells on a simulated rank are tested (tests/test_topology.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shardbench.records import Record, read_records

NODES = 2
RANKS_PER_NODE = 2
WORLD = NODES * RANKS_PER_NODE
SHARD_WIDTHS = (2, 4)
TIERS = ("within_node", "across_nodes")
#: what makes a process part of a job: the agents must not inherit a job this script runs in
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent_commands(port: int, run_argv: list[str]) -> list[list[str]]:
    """One torchrun agent per node. torchrun is run as ``python -m torch.distributed.run`` with
    this interpreter: the ``torchrun`` script of a copied virtual environment may name another
    interpreter in its first line, and run another checkout's code."""
    return [
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(NODES), "--node-rank", str(node),
         "--nproc-per-node", str(RANKS_PER_NODE), "--rdzv-backend", "c10d",
         "--rdzv-endpoint", f"localhost:{port}", "-m", "shardbench", *run_argv]
        for node in range(NODES)
    ]  # fmt: skip


def agent_env() -> dict[str, str]:
    """This environment without a job of its own, one thread per rank: the ranks share the
    host's cores, and a rank's threads would only wait for them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env = {k: v for k, v in env.items() if k not in LAUNCHER_VARIABLES}
    return {**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_job(commands: list[list[str]], logs: Path, timeout_s: float) -> list[int]:
    """Start the agents together, wait for both (killing each one's process group past the
    deadline); their exit codes. Each agent's output goes to ``logs/node<K>.log``."""
    procs = []
    for node, command in enumerate(commands):
        log = (logs / f"node{node}.log").open("w")
        # a process group each: an agent past the deadline is ended with its workers
        procs.append(subprocess.Popen(command, env=agent_env(), stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))  # fmt: skip
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return [p.returncode for p in procs]


def tier_totals(tiers: dict[str, dict[str, int]]) -> dict[str, int]:
    """Per tier, the bytes of every kind together."""
    return {tier: sum(kinds[tier] for kinds in tiers.values()) for tier in TIERS}


def agrees(measured: float, predicted: float, tolerance: float) -> bool:
    """Within ``tolerance`` of the prediction; a tier predicted to carry nothing must carry nothing."""
    if predicted == 0:
        return measured == 0
    return abs(measured / predicted - 1) <= tolerance


def cell_name(record: Record) -> str:
    return f"{record.strategy} S={record.shard_group or record.world_size}"


def check_cell(record: Record, tolerance: float) -> tuple[list[str], bool]:
    """The cell's lines (per tier: measured, predicted, ratio, verdict; the kinds measured but
    not predicted; where a tier misses, each kind's bytes) and whether it passed."""
    name = cell_name(record)
    if record.status != "ok":
        return [f"{name:18} {record.status}: {(record.error or '').splitlines()[:1]}"], False
    measured, predicted = record.comm_per_step or {}, record.predicted_comm or {}
    nodes = (measured.get("ranks_per_node"), predicted.get("ranks_per_node"))
    if nodes != (RANKS_PER_NODE, RANKS_PER_NODE):
        return [f"{name:18} ranks per node measured/predicted {nodes}, the job's is {RANKS_PER_NODE}"], False
    got, want = tier_totals(measured["tiers"]), tier_totals(predicted["tiers"])
    lines, ok = [], True
    for tier in TIERS:
        good = agrees(got[tier], want[tier], tolerance)
        ratio = f"{got[tier] / want[tier]:.4f}" if want[tier] else "-"
        lines.append(
            f"{name:18} {tier:13} {got[tier]:>12,} {want[tier]:>12,} {ratio:>8}  {'ok' if good else 'MISS'}"
        )
        ok &= good
    extra = {k: sum(v.values()) for k, v in measured["tiers"].items() if k not in predicted["tiers"]}
    if extra:
        lines.append(f"{'':18} not predicted: " + ", ".join(f"{k} {b:,} B" for k, b in sorted(extra.items())))
    if not ok:
        lines += kind_lines(measured["tiers"], predicted["tiers"])
    return lines, ok


def kind_lines(measured: dict[str, dict[str, int]], predicted: dict[str, dict[str, int]]) -> list[str]:
    """Each kind's bytes per tier, measured / predicted: which collective a miss is in."""
    none = dict.fromkeys(TIERS, 0)
    return [
        f"{'':18}   {kind:15} "
        + "  ".join(f"{t}: {measured.get(kind, none)[t]:,} / {predicted.get(kind, none)[t]:,}" for t in TIERS)
        for kind in sorted(set(measured) | set(predicted))
    ]


def across(record: Record, side: str) -> int:
    return tier_totals(getattr(record, side)["tiers"])["across_nodes"]


def zero3_factor(records: list[Record], tolerance: float) -> tuple[str, bool]:
    """zero3's bytes across nodes at S = 2 over those at S = 4, measured and predicted."""
    by_width = {
        r.shard_group or r.world_size: r for r in records if r.strategy == "zero3" and r.status == "ok"
    }
    if set(SHARD_WIDTHS) - set(by_width):
        return "zero3 S=2/S=4 across nodes: not measured (a zero3 cell is missing or failed)", False
    narrow, wide = by_width[2], by_width[4]
    measured = across(narrow, "comm_per_step") / across(wide, "comm_per_step")
    predicted = across(narrow, "predicted_comm") / across(wide, "predicted_comm")
    good = predicted < 1 and agrees(measured, predicted, tolerance)
    return (
        f"zero3 across nodes, S=2 / S=4: measured {measured:.4f}, predicted {predicted:.4f}  "
        f"{'ok' if good else 'MISS'}"
    ), good


def log_tail(path: Path, lines: int = 20) -> str:
    return "".join(path.read_text(errors="replace").splitlines(True)[-lines:])


def run_argv(args: argparse.Namespace, out: Path) -> list[str]:
    """``shardbench run``'s arguments for the job."""
    return [
        "run", "--workload", args.workload, "--preset", args.preset, "--strategy", args.strategies,
        "--world-size", str(WORLD), "--shard-group", ",".join(map(str, SHARD_WIDTHS)),
        "--precision", "fp32", "--batch-size", str(args.batch_size), "--steps", str(args.steps),
        "--warmup", str(args.warmup), "--timeout", str(args.cell_timeout), "--no-charts", "--out", str(out),
    ]  # fmt: skip


def report(records: list[Record], expected: int, tolerance: float) -> bool:
    """Print the table and the zero3 factor; whether everything agreed."""
    print(f"bytes rank 0 sends per step, measured vs predicted (tolerance {tolerance:.0%}):")
    print(f"{'cell':18} {'tier':13} {'measured':>12} {'predicted':>12} {'ratio':>8}")
    ok = len(records) == expected
    if not ok:
        print(f"{len(records)} records, {expected} cells expected")
    for record in records:
        lines, good = check_cell(record, tolerance)
        print("\n".join(lines))
        ok &= good
    line, good = zero3_factor(records, tolerance)
    print(line)
    return ok and good


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="transformer")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--strategies", default="zero1,zero2,zero3,fsdp2-hsdp")
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--cell-timeout", type=float, default=180.0, help="seconds per cell")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole job")
    ap.add_argument("--tolerance", type=float, default=0.01)
    ap.add_argument("--out", type=Path, help="the run's directory (default: a new temporary one)")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="two-node-tiers-"))
    out.mkdir(parents=True, exist_ok=True)
    commands = agent_commands(free_port(), run_argv(args, out / "run"))
    print(f"job: {NODES} torchrun agents on this host, {RANKS_PER_NODE} ranks each; run in {out}")
    print(f"{args.workload}/{args.preset} fp32 b={args.batch_size}, {args.steps} steps, S = 2 and 4")
    start = time.monotonic()
    codes = run_job(commands, out, args.timeout)
    print(f"agents exited {codes} after {time.monotonic() - start:.0f} s")
    if any(codes) or not (out / "run" / "records.jsonl").exists():
        for node in range(NODES):
            print(f"--- node{node}.log, its end:\n{log_tail(out / f'node{node}.log')}")
        return 2
    records = read_records([out / "run"])
    expected = len(args.strategies.split(",")) * len(SHARD_WIDTHS)
    return 0 if report(records, expected, args.tolerance) else 1


if __name__ == "__main__":
    sys.exit(main())
