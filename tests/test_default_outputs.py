"""What a command writes when not told where lands in a place git ignores (``results/runs/`` or
an ignored pattern), so a fresh checkout stays clean after trying the commands; committed
evidence is never hidden by those patterns. ``baseline save`` is the one exception on purpose: a
saved baseline is made to be committed (the README's "once, commit it")."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from shardbench.cli import main
from shardbench.cli.claim import CLAIMS_DIR
from shardbench.cli.common import DEFAULT_RUNS_DIR
from shardbench.paths import history_file
from tests.git_files import not_ignored
from tests.records import make_record

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs git and the checkout"
)


@pytest.fixture(autouse=True)
def _results_home_is_the_default(monkeypatch) -> None:
    monkeypatch.delenv("SHARDBENCH_HOME", raising=False)  # the tests' own home, set by conftest


def _written(where: Path) -> list[Path]:
    return sorted(p.relative_to(where) for p in where.rglob("*") if p.is_file())


def test_default_output_locations_are_ignored() -> None:
    run_dir = DEFAULT_RUNS_DIR / "20261201-000000-smoke-1a2b.0"  # run, plan, max-size, nightly
    history = history_file("my-suite")  # nightly --suite my-suite.toml
    paths = [
        run_dir / "records.jsonl",
        run_dir / "table.md",
        run_dir / "peak_memory-transformer.png",
        CLAIMS_DIR / "tiny" / "report.md",  # claim --spec tiny
        CLAIMS_DIR / "tiny" / "records.jsonl",
        CLAIMS_DIR / "cuda" / "step_time-transformer.png",  # claim --device cuda
        CLAIMS_DIR / "cpu-hf-GPT2LMHeadModel" / "report.md",  # claim --workload of one's own
        history,
        history_file("nightly-gpu"),
        history.parent / "trend-my-suite" / "trend.html",  # trend beside the history
    ]
    assert not_ignored(paths) == []


def test_committed_evidence_is_not_hidden_by_those_patterns() -> None:
    hidden = subprocess.run(
        ["git", "ls-files", "--cached", "--ignored", "--exclude-standard", "--", "results"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert hidden == []
    # a file added to a committed folder shows, as a change to that evidence should
    new = [CLAIMS_DIR / "cpu" / "report.md", CLAIMS_DIR / "cpu" / "step_time-newnet.png"]
    assert not_ignored([*new, history_file("nightly-cpu")]) == [str(p) for p in new] + [
        str(history_file("nightly-cpu"))
    ]


def _records(path: Path) -> Path:
    records = [make_record(strategy=s, step_times_s=[0.1, 0.2, 0.3]) for s in ("ddp", "zero2")]
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    return path


def test_report_compare_and_export_of_a_records_file_write_nothing_beside_it(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """A records file that is not a run's own (a saved baseline, a file of one's own): report and
    compare write into a folder of their own under results/runs/, not into the directory the
    command runs in nor beside a baseline; export writes to standard output."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("shardbench.report.build.plot_all", lambda records, out_dir: {})
    kept = tmp_path / "kept"
    kept.mkdir()
    base, now = _records(kept / "base.jsonl"), _records(kept / "now.jsonl")
    assert main(["compare", str(base), str(now)]) == 0
    assert main(["report", str(now)]) == 0
    assert main(["export", "--format", "pytest-benchmark", str(now)]) == 0
    capsys.readouterr()
    assert _written(kept) == [Path("base.jsonl"), Path("now.jsonl")]
    written = [p for p in _written(tmp_path) if p.parts[0] != "kept"]
    assert {"compare.md", "table.md", "index.html"} <= {p.name for p in written}
    assert all(p.is_relative_to(DEFAULT_RUNS_DIR) for p in written), written
    assert not_ignored(written) == []
