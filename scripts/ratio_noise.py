"""Where the noise of the step-time ratios to ddp is, from records of several runs (a saved
baseline, or runs' records.jsonl): what decides how many timed steps each cell of a nightly suite
takes (docs/nightly.md, "Where the steps go").

    .venv/bin/python scripts/ratio_noise.py results/baselines/cpu/nightly-cpu.jsonl [--cpu Intel]
        [--suite nightly-cpu]

Per timed cell of one machine (``--cpu``: a part of the CPU model; default: the machine of the
last record), as ``compare`` reads them (``studies/compare_ratios``):

- ratio: the cell's step-time ratio to its group's ddp, the median of its pairs;
- step MAD: the cell's steps' MAD, % of their median (the median over its records), and the
  group's ddp's;
- pair error: a pair's own standard error from its steps (both medians', combined), %, the
  median over pairs: it falls with the square root of the timed steps;
- pair spread: how far a pair's ratio strays from its run's, as a standard deviation (MAD x
  1.4826), % of the ratio: what the machine adds between two pairs of one run;
- run spread: the standard deviation of the runs' ratios, % of the ratio;
- step ms and steps: the median step time and the timed steps, the cost of a step more.

Then per strategy the same, pooled over its cells, and the spread of a run's mean log ratio
over a strategy's cells, pooled over the strategies (``compare_strategy.run_spread``): what a
run does as a whole, which the strategy-wide test cannot average out over cells.

With ``--suite``, each cell's pair error as it would be at that suite's timed steps (the cell's
and its ddp's: a median's standard error falls with the square root of the steps), and the
seconds a night spends in timed and warm-up steps, now and at the suite's steps: how to spend
a night's minutes where the noise is.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from pathlib import Path

from shardbench.records import CellKey, read_records
from shardbench.studies.compare_ratios import cell_ratios, pair_spread
from shardbench.studies.compare_strategy import MIN_CELLS, CellChange, run_spread
from shardbench.studies.machines import machine_of

MAD_TO_SD = 1.4826


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", type=Path, nargs="+")
    ap.add_argument("--cpu", help="a part of the CPU model of the machine to read")
    ap.add_argument("--suite", help="predict each cell's pair error at this suite's timed steps")
    args = ap.parse_args(argv)
    planned = _suite_steps(args.suite) if args.suite else {}
    records = read_records(args.records)
    if args.cpu:
        records = [r for r in records if args.cpu in str(r.env.get("cpu_model", ""))]
    else:
        records = [r for r in records if machine_of(r) == machine_of(records[-1])]
    timed = [r for r in records if r.status == "ok" and r.step_time_s and not r.simulated and not r.fake]
    groups: dict[CellKey, list] = defaultdict(list)
    for r in timed:
        groups[CellKey.of(r)].append(r)
    ratios = cell_ratios(groups)
    ddp = {k.without("strategy"): rs for k, rs in groups.items() if k.strategy == "ddp"}
    head = (
        "cell",
        "ratio",
        "step MAD%",
        "ddp MAD%",
        "pair err%",
        "pair spread%",
        "run spread%",
        "step ms",
        "steps",
    )
    head += ("suite steps", "pair err% there") if planned else ()
    rows, by_strategy = [head], defaultdict(list)
    for key, ratio in sorted(ratios.items(), key=lambda kv: (kv[0].workload, kv[0].strategy)):
        value = ratio.value
        spread = pair_spread([ratio]) * 100
        runs = ratio.per_run()
        run_sd = 100 * statistics.stdev(runs) / value if len(runs) > 1 else float("nan")
        error = 100 * statistics.median(ratio.errors) / value
        rows.append(
            (
                f"{key.workload}/{key.strategy}",
                f"{value:.3f}",
                f"{_mad_pct(groups[key]):.1f}",
                f"{_mad_pct(ddp[key.without('strategy')]):.1f}",
                f"{error:.1f}",
                f"{spread:.1f}",
                f"{run_sd:.1f}",
                f"{1e3 * statistics.median(r.step_time_s['median'] for r in groups[key]):.1f}",
                str(ratio.steps),
            )
            + (_predicted(key, groups, ddp, planned) if planned else ())
        )
        by_strategy[key.strategy].append((ratio, error, run_sd))
    print(_table(rows))
    print()
    rows = [("strategy", "cells", "pair err%", "pair spread%", "run spread%")]
    for strategy, cells in sorted(by_strategy.items()):
        rows.append(
            (
                strategy,
                str(len(cells)),
                f"{statistics.fmean(c[1] for c in cells):.1f}",
                f"{100 * pair_spread(c[0] for c in cells):.1f}",
                f"{statistics.fmean(c[2] for c in cells):.1f}",
            )
        )
    print(_table(rows))
    print(f"\npair spread pooled over every cell: {100 * pair_spread(ratios.values()):.1f}%")
    changes: dict[tuple[str, str], list[CellChange]] = defaultdict(list)
    for key, ratio in ratios.items():
        change = CellChange(key.strategy, key.device, "", 0.0, 0.0, 0.0, 0.0, base_runs=ratio.run_logs())
        changes[(key.strategy, key.device)].append(change)
    wide = run_spread({g: cs for g, cs in changes.items() if len(cs) >= MIN_CELLS})
    print(
        "a run's mean log ratio over a strategy's cells, pooled sd: "
        + ", ".join(f"{d} {100 * v:.1f}%" for d, v in wide.items())
    )
    if planned:
        cost = lambda steps_of: sum(  # noqa: E731 - seconds of timed and warm-up steps, every repeat
            (steps_of(k) + planned[k][1])
            * planned[k][2]
            * statistics.median(r.step_time_s["median"] for r in rs)
            for k, rs in groups.items()
            if k in planned
        )
        now = cost(lambda k: statistics.median(r.steps for r in groups[k]))
        then = cost(lambda k: planned[k][0])
        print(
            f"timed and warm-up steps a night: {now:.0f} s as recorded, {then:.0f} s at {args.suite}'s steps"
        )
    return 0


def _suite_steps(suite: str) -> dict[CellKey, tuple[int, int, int]]:
    """{cell identity: (timed steps, warm-up steps, repeats)} of a suite's timed cells."""
    from shardbench.harness.config import load_suite

    out: dict[CellKey, tuple[int, int, int]] = {}
    for c in load_suite(suite).cells():
        if c.simulate or c.fake:
            continue
        key, _ = c.key()
        steps, warmup, repeats = out.get(key, (c.steps, c.warmup, 0))
        out[key] = (steps, warmup, repeats + 1)
    return out


def _predicted(key: CellKey, groups: dict, ddp: dict, planned: dict) -> tuple[str, str]:
    """The suite's steps for the cell, and its pair error at those steps and its ddp's."""
    reference = ddp[key.without("strategy")]
    ref_key = CellKey.of(reference[0])
    if key not in planned or ref_key not in planned:
        return ("-", "-")
    error = (
        1.2533
        * MAD_TO_SD
        * math.hypot(
            _mad_pct(groups[key]) / math.sqrt(planned[key][0]),
            _mad_pct(reference) / math.sqrt(planned[ref_key][0]),
        )
    )
    return (str(planned[key][0]), f"{error:.1f}")


def _mad_pct(records: list) -> float:
    return 100 * statistics.median(r.step_time_s["mad"] / r.step_time_s["median"] for r in records)


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in rows
    )


if __name__ == "__main__":
    raise SystemExit(main())
