"""The README's example of planning your own model runs as written (``examples/mymodel.py``),
its cells run in this process (the launcher is tested elsewhere)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shardbench.cli import main
from shardbench.harness import runner
from shardbench.records import read_records
from shardbench.studies.plan import PLAN_STRATEGIES, UNPLANNED, plannable
from tests.cells import run_cell_here

ROOT = Path(__file__).resolve().parents[1]


def test_readme_plan_example_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    readme = (ROOT / "README.md").read_text()
    (command,) = re.findall(
        r"^ {4}\.venv/bin/shardbench (plan --workload examples/mymodel\.py:factory .*)$", readme, re.M
    )
    monkeypatch.chdir(ROOT)  # the example's path is relative to the checkout
    monkeypatch.setattr(runner, "run_cell", lambda cell, *, run_id: run_cell_here(cell, run_id=run_id))
    assert main([*command.split()[0:], "--out", str(tmp_path / "plan")]) == 0
    records = read_records([tmp_path / "plan"])
    assert sorted(r.strategy for r in records) == sorted(PLAN_STRATEGIES)
    assert all(r.params == 7_361_536 for r in records)
    # every strategy keeps its row: the peers that cannot be a simulated rank say so
    assert {r.strategy for r in records if r.status != "ok"} == {
        s for s in PLAN_STRATEGIES if not plannable(s)
    }
    assert all(r.status == "skipped" and UNPLANNED in r.note for r in records if r.status != "ok")
    assert "recommended: " in capsys.readouterr().out
