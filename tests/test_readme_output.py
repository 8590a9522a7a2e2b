"""The README's example of ``shardbench run`` is what the command prints, line for line in its
format (each cell's progress line, the table, the lines under it, where the report and the
records went), and its figures are given with how far they move from run to run: a reader who
runs the suite and sees other numbers is told to expect them."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from shardbench.cli import main
from shardbench.harness import runner
from shardbench.records import read_records

ROOT = Path(__file__).resolve().parents[1]
#: committed records of the smoke suite's workloads (tiny presets, N = 2, predicted step and
#: MFU): the figures a stand-in run prints, in the format the README's example must have
SMOKE_CELLS = ROOT / "results/cpu/20261204-nightly-torchrun/local/records.jsonl"
NUMBER = re.compile(r"\d+(\.\d+)?")
RUN_DIR = re.compile(r"results/runs/[^/\s]+")


def _readme_run_output() -> list[str]:
    text = (ROOT / "README.md").read_text()
    (block,) = re.findall(r"^```\n\$ \.venv/bin/shardbench run\n(.*?)^```", text, re.M | re.S)
    return block.splitlines()


def _shape(line: str) -> str:
    """The line with its numbers as ``#``, each run's own folder as ``<run_id>`` and its spacing
    as one space."""
    return " ".join(NUMBER.sub("#", RUN_DIR.sub("results/runs/<run_id>", line)).split())


@pytest.fixture
def printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> list[str]:
    """What ``.venv/bin/shardbench run`` prints, stderr and stdout, each cell standing in for by
    a committed record of its workload (of its strategy where one was committed)."""
    committed = [
        r
        for r in read_records([SMOKE_CELLS])
        if r.status == "ok" and r.preset == "tiny" and r.world_size == 2 and r.repeat == 0 and not r.simulated
    ]

    def stand_in(cell, *, run_id):
        like = [r for r in committed if r.workload == cell.workload]
        assert like, f"no committed record of {cell.workload}"
        same = [r for r in like if r.strategy == cell.strategy] or like
        return replace(same[0], run_id=run_id, strategy=cell.strategy, batch_size_per_rank=cell.batch_size)

    monkeypatch.setattr(runner, "run_cell", stand_in)
    monkeypatch.setattr("shardbench.report.build.plot_all", lambda records, out_dir: {})
    monkeypatch.delenv("SHARDBENCH_HOME", raising=False)
    monkeypatch.chdir(tmp_path)  # the run goes where the README's does: results/runs/<run_id>
    assert main(["run"]) == 0
    out = capsys.readouterr()
    return [*out.err.splitlines(), *out.out.splitlines()]


def test_readme_run_example_has_the_format_run_prints(printed: list[str]) -> None:
    shown = _readme_run_output()
    header = next(line for line in shown if line.startswith("workload "))
    assert header.split() == next(line for line in printed if line.startswith("workload ")).split()
    shapes = {_shape(line) for line in printed}
    assert [line for line in shown if _shape(line) not in shapes] == []
    # every kind of line run prints is shown: each cell's progress, the table, where things went
    kinds = (
        "/tiny ddp N=",
        "workload ",
        "MFU against",
        " vs ddp: ",
        "predicted step",
        "report: ",
        "cells run",
    )
    assert [kind for kind in kinds if not any(kind in line for line in shown)] == []


def test_readme_says_how_far_the_example_figures_move() -> None:
    text = " ".join((ROOT / "README.md").read_text().split())
    error = re.search(r"median absolute error of the predicted step time from (\d+)% to (\d+)%", text)
    ratio = re.search(r"transformer tiny's pred/meas from ([\d.]+) to ([\d.]+)", text)
    assert error and ratio, "the README no longer says how the run's prediction figures vary"
    shown = _readme_run_output()
    (median,) = [int(m[1]) for line in shown if (m := re.search(r"median absolute error (\d+)%", line))]
    assert int(error[1]) <= median <= int(error[2])
    transformer = [line.split() for line in shown if line.startswith("transformer  tiny")]
    assert transformer and all(float(ratio[1]) <= float(row[-1]) <= float(ratio[2]) for row in transformer), (
        "pred/meas of transformer tiny outside the range the README states"
    )


def test_the_plan_example_is_within_the_first_50_lines() -> None:
    """A newcomer meets the answer to "will my model fit?" without scrolling past a run's log."""
    lines = (Path(__file__).resolve().parents[1] / "README.md").read_text().splitlines()
    plan = ".venv/bin/shardbench plan "
    first = next(i for i, line in enumerate(lines, 1) if line.strip().startswith(plan))
    assert first <= 50, f"README's plan example starts at line {first}"
