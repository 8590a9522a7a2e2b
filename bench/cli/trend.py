"""``shardbench trend``: charts of each metric per cell over the nights of a history file.

The nightly job appends the history (``results/history/<suite>.jsonl``); this command only
reads it, so it is safe to run at any time, on any copy. It exits 0 whatever the nights say:
the gate is the nightly command, this is the view. matplotlib is imported inside ``cmd_trend``
so that ``shardbench --help`` and the other subcommands do not pay for it.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from shardbench.cli.common import UsageError


def add_trend_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trend", help="charts of each metric per cell over the nights of a history file")
    p.add_argument("history", type=Path, help="a nightly history, e.g. results/history/nightly-cpu.jsonl")
    p.add_argument("--out", type=Path, help="output directory (default: trend-<suite> beside the history)")


def cmd_trend(args: argparse.Namespace) -> int:
    from shardbench.harness.validate import check_output_dir
    from shardbench.paths import inside, path_component
    from shardbench.report.trend_charts import write_trend
    from shardbench.report.trend_html import unrecorded_line
    from shardbench.studies.trend import alarms, last_night, night_of, read_history
    from shardbench.wording import count

    path: Path = args.history
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = read_history(path)
        for w in caught:  # a bad line is named and skipped; the good ones still make the charts
            print(f"shardbench trend: warning: {w.message}", file=sys.stderr)
        if not history:
            raise ValueError(f"{path} holds no valid history line (need JSON objects with suite, cell, time)")
        suites = sorted({line["suite"] for line in history})
        # the suite comes from the file's lines: a name, never a path (it cannot leave the folder)
        label = suites[0] if len(suites) == 1 else path.stem
        out = args.out or inside(path.parent, f"trend-{path_component(label, what='suite name')}")
        check_output_dir(out)
        page = write_trend(path, out, history=history)
    except ValueError as e:
        raise UsageError(str(e)) from None
    nights = len({night_of(line) for line in history})
    found = alarms(last_night(history))
    cells = count(len({line["cell"] for line in history}), "cell")
    news = count(len(found), "regression or newly failing cell", "regressions or newly failing cells")
    print(f"{count(nights, 'night')}, {cells}; last night: {news}; open {page}")
    if line := unrecorded_line(history):
        print(line)
    return 0
