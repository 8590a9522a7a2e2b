"""The README's example of ``shardbench run`` is what the command prints, number for number in
its format, and its figures are given with how far they move from run to run: a reader who runs
the suite and sees other numbers is told to expect them."""

from __future__ import annotations

import re
from pathlib import Path

from shardbench.records import read_records
from shardbench.report.terminal import DEFAULT_COLUMNS, terminal_table

ROOT = Path(__file__).resolve().parents[1]
#: committed records of the smoke suite's cells (tiny presets, N = 2, predicted step and MFU):
#: what ``run`` prints for them is the format the README's example must have
SMOKE_CELLS = ROOT / "results/cpu/20261204-nightly-torchrun/local/records.jsonl"
NUMBER = re.compile(r"\d+(\.\d+)?")


def _readme_run_output() -> list[str]:
    text = (ROOT / "README.md").read_text()
    (block,) = re.findall(r"^```\n\$ \.venv/bin/shardbench run\b[^\n]*\n(.*?)^```", text, re.M | re.S)
    return block.splitlines()


def _shape(line: str) -> str:
    """The line with its numbers as ``#`` and its spacing as one space."""
    return " ".join(NUMBER.sub("#", line).split())


def _printed() -> list[str]:
    records = [
        r
        for r in read_records([SMOKE_CELLS])
        if r.repeat == 0 and r.status == "ok" and r.strategy in ("ddp", "zero2") and r.preset == "tiny"
    ]
    assert {r.workload for r in records} >= {"deepspeech2", "swav", "transformer"}
    return terminal_table(records, DEFAULT_COLUMNS).splitlines()


def test_readme_run_example_has_the_format_run_prints() -> None:
    shown, printed = _readme_run_output(), _printed()
    assert shown[0].split() == printed[0].split()  # the header: the default columns
    shapes = {_shape(line) for line in printed}
    assert [line for line in shown if _shape(line) not in shapes] == []


def test_readme_says_how_far_the_example_figures_move() -> None:
    text = " ".join((ROOT / "README.md").read_text().split())
    error = re.search(r"median absolute error of the predicted step time from (\d+)% to (\d+)%", text)
    ratio = re.search(r"transformer tiny's pred/meas from ([\d.]+) to ([\d.]+)", text)
    assert error and ratio, "the README no longer says how the run's prediction figures vary"
    shown = _readme_run_output()
    header = shown[0].split()
    (median,) = [int(m[1]) for line in shown if (m := re.search(r"median absolute error (\d+)%", line))]
    assert int(error[1]) <= median <= int(error[2])
    transformer = [line.split() for line in shown if line.startswith("transformer  tiny")]
    assert transformer and all(float(ratio[1]) <= float(row[-1]) <= float(ratio[2]) for row in transformer), (
        f"{header[-1]} of transformer tiny outside the range the README states"
    )
