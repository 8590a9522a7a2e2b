"""How well the step-time model predicts a grid of real cells: the held-out check of `plan`.

Runs each workload at its paper preset under ddp, zero1, zero2, zero3 and fsdp2-zero3 at N = 2
and 4 (real gloo ranks), each cell ``--repeat`` times interleaved (``run --repeat``: a cell's
repeats are spread over the run, so a drift of the machine hits every cell alike), then prints
per cell the measured median step (the median over repeats of each repeat's median), its noise
(the spread of the repeats), the predicted step and their ratio, and over the grid:

- MAPE, the mean of |predicted / measured - 1|, and the largest error;
- the ranking agreement: of the pairs of strategies (same workload and N) whose measured steps
  differ beyond their noise, how many the prediction orders the same way;
- the interval coverage, where the records carry a predicted interval: how many measured
  medians fall inside it.

    .venv/bin/python scripts/prediction_grid.py                      # the full grid (hours on 2 cores)
    .venv/bin/python scripts/prediction_grid.py --preset tiny --repeat 2 --world-sizes 2
    .venv/bin/python scripts/prediction_grid.py --from DIR          # the figures of a grid already run

Not part of the test suite: the full grid takes hours on two cores. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from shardbench.prediction.accuracy import predicted_over_measured
from shardbench.records import Record, load_records

#: each workload's paper preset and the batch per rank the claim measures it at
PAPER = {
    "transformer": ("base", 2),
    "imagegpt": ("igpt-s", 1),
    "swav": ("rn50", 1),
    "deepspeech2": ("paper", 1),
}
STRATEGIES = "ddp,zero1,zero2,zero3,fsdp2-zero3"


@dataclass(frozen=True)
class GridCell:
    """One (workload, strategy, N) over its repeats."""

    workload: str
    strategy: str
    world_size: int
    measured: float  # the median over repeats of each repeat's median step, seconds
    # the spread of the repeats' medians: half of (max - min); None for one repeat, which has no
    # spread to judge a difference by
    noise: float | None
    predicted: float
    interval: tuple[float, float] | None

    @property
    def ratio(self) -> float:
        return self.predicted / self.measured


def run_grid(out: Path, args: argparse.Namespace) -> None:
    """One ``shardbench run`` per workload, its strategies, world sizes and repeats interleaved."""
    for workload in args.workloads.split(","):
        preset, batch = PAPER[workload]
        command = [
            sys.executable, "-m", "shardbench", "run", "--workload", workload,
            "--preset", args.preset or preset, "--batch-size", str(batch), "--strategy", args.strategies,
            "--world-size", args.world_sizes, "--repeat", str(args.repeat), "--steps", str(args.steps),
            "--timeout", str(args.timeout), "--no-charts", "--out", str(out / workload),
        ]  # fmt: skip
        print("$", " ".join(command[2:]), flush=True)
        subprocess.run(command, check=False)


def grid_cells(records: list[Record]) -> list[GridCell]:
    """The grid's cells, each over its repeats; cells without a prediction are left out."""
    by_cell: dict[tuple[str, str, int], list[Record]] = defaultdict(list)
    for r in records:
        if predicted_over_measured(r) is not None:
            by_cell[(r.workload, r.strategy, r.world_size)].append(r)
    cells = []
    for (workload, strategy, n), repeats in sorted(by_cell.items()):
        medians = [r.step_time_s["median"] for r in repeats]
        noise = (max(medians) - min(medians)) / 2 if len(medians) > 1 else None
        predicted = statistics.median(r.predicted_step_time.step for r in repeats)
        interval = repeats[0].predicted_step_time.interval
        cells.append(
            GridCell(
                workload, strategy, n, statistics.median(medians), noise,
                predicted, tuple(interval) if interval else None,
            )
        )  # fmt: skip
    return cells


def ranking(cells: list[GridCell]) -> tuple[int, int, list[str], int]:
    """Pairs (same workload and N) measured apart beyond their noise: how many, how many the
    prediction orders alike, the ones it orders the other way, and how many pairs were not
    judged (a cell of one repeat has no noise to judge by)."""
    groups: dict[tuple[str, int], list[GridCell]] = defaultdict(list)
    for c in cells:
        groups[(c.workload, c.world_size)].append(c)
    apart = agree = unjudged = 0
    wrong = []
    for group in groups.values():
        for a, b in itertools.combinations(group, 2):
            if a.noise is None or b.noise is None:
                unjudged += 1
                continue
            if abs(a.measured - b.measured) <= a.noise + b.noise:
                continue
            apart += 1
            if (a.measured < b.measured) == (a.predicted < b.predicted):
                agree += 1
            else:
                wrong.append(f"{a.workload} N={a.world_size}: {a.strategy} vs {b.strategy}")
    return apart, agree, wrong, unjudged


def report(cells: list[GridCell]) -> None:
    print(f"{'cell':<40} {'measured':>10} {'noise':>8} {'predicted':>10} {'pred/meas':>9}")
    for c in cells:
        name = f"{c.workload} {c.strategy} N={c.world_size}"
        noise = f"{c.noise:>7.4f}s" if c.noise is not None else f"{'-':>8}"
        print(f"{name:<40} {c.measured:>9.4f}s {noise} {c.predicted:>9.4f}s {c.ratio:>9.3f}")
    errors = [abs(c.ratio - 1) for c in cells]
    print(f"MAPE {statistics.mean(errors):.1%} over {len(cells)} cells; largest error {max(errors):.1%}")
    apart, agree, wrong, unjudged = ranking(cells)
    print(f"ranking: {agree} of {apart} pairs measured apart beyond noise ordered alike")
    if unjudged:
        print(f"  not judged: {unjudged} pairs with a cell of one repeat (no noise between repeats)")
    for line in wrong:
        print(f"  ordered the other way: {line}")
    covered = [c for c in cells if c.interval is not None]
    if covered:
        inside = sum(c.interval[0] <= c.measured <= c.interval[1] for c in covered)
        print(f"intervals: {inside} of {len(covered)} measured medians inside the predicted interval")
    else:
        print("intervals: the records carry no predicted interval")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("results/runs/prediction-grid"))
    ap.add_argument("--from", dest="source", type=Path, help="a grid already run: print its figures only")
    ap.add_argument("--workloads", default=",".join(PAPER))
    ap.add_argument("--strategies", default=STRATEGIES)
    ap.add_argument("--world-sizes", default="2,4")
    ap.add_argument("--preset", help="one preset for every workload instead of the paper presets")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    # a paper preset's cell with four ranks on two cores runs past the smoke suite's 300 s
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per cell before it times out")
    args = ap.parse_args()
    if args.source is None:
        run_grid(args.out, args)
    root = args.source or args.out
    runs = sorted(d for d in root.iterdir() if (d / "records.jsonl").is_file()) if root.is_dir() else []
    cells = grid_cells(load_records(runs or root))
    if not cells:
        print("no cell with both a measured and a predicted step", file=sys.stderr)
        return 1
    report(cells)
    return 0


if __name__ == "__main__":
    sys.exit(main())
