"""``baseline save`` leaves in the checkout only what it asks to be committed: the baseline and
its manifest. What else it writes (the lock it holds while it rewrites the baseline) is ignored
by git, so ``git status`` after the README's "once, commit it" shows the two files alone; the
history ``nightly`` appends to under the same kind of lock is held to the same."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from shardbench.cli import main
from shardbench.paths import history_file
from shardbench.studies.history import append_history
from tests.git_files import not_ignored
from tests.records import make_record

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs git and the checkout"
)


def written(where: Path) -> list[Path]:
    return sorted(p.relative_to(where) for p in where.rglob("*") if p.is_file())


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory standing for the checkout's root, results under ./results."""
    monkeypatch.delenv("SHARDBENCH_HOME", raising=False)  # the tests' own home, set by conftest
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_baseline_save_leaves_only_the_files_to_commit(checkout: Path, capsys) -> None:
    run = checkout / "results" / "runs" / "r1"
    run.mkdir(parents=True)
    records = [make_record(strategy=s) for s in ("ddp", "zero2")]
    (run / "records.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    assert main(["baseline", "save", str(run), "--as", "nightly-mine"]) == 0
    said = capsys.readouterr().out
    saved = [p for p in written(checkout) if p.parts[:2] == ("results", "baselines")]
    assert saved, said
    to_commit = [f"results/baselines/cpu/nightly-mine.{end}" for end in ("jsonl", "manifest.json")]
    assert sorted(not_ignored(saved)) == to_commit
    assert all(name in said for name in to_commit) and "commit both" in said


def test_a_nights_history_leaves_no_other_file_git_shows(checkout: Path) -> None:
    history = history_file("my-suite")
    append_history(history, [{"night": 1}])
    assert not_ignored(written(checkout)) == []


SUITE = """
description = "one night of two stand-in cells"
workloads = ["transformer"]
strategies = ["ddp", "zero2"]
world_sizes = [2]
presets = ["tiny"]
"""


def test_a_night_leaves_no_lock_in_its_folder(
    checkout: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The lock that keeps a second night out of the same --out is gone once the night ends."""
    from shardbench.harness import runner

    def stand_in(cell, *, run_id):
        return make_record(run_id=run_id, strategy=cell.strategy, world_size=cell.world_size)

    monkeypatch.setattr(runner, "run_cell", stand_in)
    monkeypatch.setattr("shardbench.report.build.plot_all", lambda records, out_dir: {})
    monkeypatch.setattr("shardbench.cli.nightly._write_trend", lambda history, out: "")
    suite = checkout / "night.toml"
    suite.write_text(SUITE)
    assert main(["run", "--suite", str(suite), "--out", str(checkout / "base"), "--no-charts"]) == 0
    assert main(["baseline", "save", str(checkout / "base"), "--as", "night"]) == 0
    night = checkout / "results" / "runs" / "night-1"
    assert main(["nightly", "--suite", str(suite), "--out", str(night)]) == 0, capsys.readouterr()
    assert [p.name for p in night.iterdir() if p.name.endswith(".lock")] == []
