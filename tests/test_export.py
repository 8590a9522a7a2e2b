"""``shardbench export --format pytest-benchmark``: the file loads with pytest-benchmark's own
loader and ``pytest-benchmark compare``, one benchmark per ok record with its per-step times,
whose statistics are pytest-benchmark's own; failures and summary-only records are skipped; bad
input is exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardbench.cli import main
from shardbench.records import Record, append_record
from shardbench.studies.export import NO_STEP_TIMES, step_stats, to_pytest_benchmark
from tests.records import make_record

ROOT = Path(__file__).resolve().parent.parent
#: eight steps with a slow one: the mean is not the median, the extremes not p10/p90
TIMES = [0.25, 0.24, 0.26, 0.25, 0.23, 0.25, 0.27, 0.40]
STEP = {"median": 0.25, "mad": 0.01, "n": 8, "p10": 0.237, "p90": 0.309}


def _record(strategy: str, *, status: str = "ok", world_size: int = 2, **kw) -> Record:
    base = dict(
        run_id="20261130-000000-smoke",
        suite="smoke",
        strategy=strategy,
        world_size=world_size,
        requested_world_size=world_size,
        batch_size_per_rank=4,
        steps=8,
        status=status,
        step_time_s=dict(STEP) if status == "ok" else None,
        step_times_s=list(TIMES) if status == "ok" else None,
        peak_mem_bytes={"per_rank": [100, 90], "max": 100, "source": "tracked tensors (MemTracker)"},
        env={"host": "vm", "python": "3.11.7", "git_sha": "abc123", "time": "2026-11-30T00:51:44+0000"},
    )
    return make_record(**{**base, **kw})


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    for r in (
        _record("ddp"),
        _record("zero2", step_times_s=[t - 0.05 for t in TIMES]),
        _record("zero2", world_size=8, simulated=True, backend="fake"),
        _record("fsdp2-zero2", status="oom", error="CUDA out of memory"),
        _record("zero1", fake=True, step_time_s=None, step_times_s=None, note="fake: planned"),
        _record("zero3", step_times_s=None),  # only the summary of its step times
    ):
        append_record(run / "records.jsonl", r)
    return run


NAMES = [
    "transformer/tiny/ddp/n2/fp32/b4",
    "transformer/tiny/zero2/n2/fp32/b4",
    "transformer/tiny/zero2/n8-sim/fp32/b4",
]


def test_export_loads_with_pytest_benchmarks_own_loader_and_compare(run_dir, tmp_path) -> None:
    from pytest_benchmark.logger import Logger
    from pytest_benchmark.storage.file import FileStorage

    out = tmp_path / "exported.json"
    assert main(["export", "--format", "pytest-benchmark", str(run_dir), "--out", str(out)]) == 0
    storage = FileStorage(tmp_path / "storage", logger=Logger(Logger.QUIET))
    loaded = {b["name"]: b for b in storage.load_benchmarks(str(out))}
    assert sorted(loaded) == sorted(NAMES)  # the oom and the fake (no step time) are skipped
    ddp = loaded["transformer/tiny/ddp/n2/fp32/b4"]
    assert ddp["iterations"] == 1 and ddp["extra_info"]["peak_mem_bytes"]["max"] == 100
    assert ddp["extra_info"]["step_time_s"] == STEP
    assert ddp["mean"] == pytest.approx(sum(TIMES) / 8) and ddp["mean"] > ddp["median"] == 0.25
    assert (ddp["min"], ddp["max"], ddp["rounds"]) == (0.23, 0.40, 8)
    meta = json.loads(out.read_text())["shardbench"]
    skipped = {s["name"].split("/")[2]: s["why"] for s in meta["skipped"]}
    assert skipped == {"fsdp2-zero2": "not ok", "zero1": "no step time", "zero3": NO_STEP_TIMES}

    # the compare command (as a user runs it); it exits 0 even when a file fails to load, so the
    # names must be in its table and no load failure in its output
    cmd = [sys.executable, "-m", "pytest_benchmark", "compare", str(out)]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Failed to load" not in done.stdout + done.stderr
    for name in NAMES:
        assert name in done.stdout


def test_export_to_stdout_and_bad_input(run_dir, tmp_path, capsys) -> None:
    assert main(["export", "--format", "pytest-benchmark", str(run_dir / "records.jsonl")]) == 0
    captured = capsys.readouterr()
    assert len(json.loads(captured.out)["benchmarks"]) == 3
    assert "exported 3 benchmarks, skipped 3 records" in captured.err

    failed = tmp_path / "failed.jsonl"
    append_record(failed, _record("ddp", status="timeout"))
    for argv, needle in (
        ([str(tmp_path / "nope")], "not a run directory with records.jsonl"),
        ([str(failed)], "nothing to export"),
        ([str(run_dir), "--out", str(tmp_path)], "is a directory"),
    ):
        assert main(["export", "--format", "pytest-benchmark", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    "times",
    [
        [0.5],
        [0.2, 0.3],
        [0.3, 0.1, 0.2],
        TIMES,
        TIMES[:5],
        TIMES[:6],
        TIMES[:7],
        [*TIMES, 0.1, 0.9, 0.25],
        [*TIMES, 0.1, 0.9, 0.25, 0.24, 0.26],
    ],
)
def test_every_statistic_is_pytest_benchmarks_own(times) -> None:
    from pytest_benchmark.stats import Stats

    theirs = Stats()
    for t in times:
        theirs.update(t)
    ours = step_stats(times)
    assert ours.pop("iterations") == 1
    for key, value in theirs.as_dict().items():
        assert ours[key] == (value if isinstance(value, str) else pytest.approx(value)), key


def test_repeats_get_their_own_names_and_two_runs_of_one_cell_are_refused() -> None:
    first, again = _record("ddp"), _record("ddp")
    again.repeat = 1  # type: ignore[attr-defined]  # ``run --repeat`` records (schema 3) carry it
    names = [b["name"] for b in to_pytest_benchmark([first, again])["benchmarks"]]
    assert names == ["transformer/tiny/ddp/n2/fp32/b4", "transformer/tiny/ddp/n2/fp32/b4/r1"]
    with pytest.raises(ValueError, match="two ok records for transformer/tiny/ddp/n2/fp32/b4"):
        to_pytest_benchmark([first, _record("ddp", run_id="another")])


def test_the_export_command_imports_no_torch() -> None:
    code = "import sys, shardbench.cli, shardbench.studies.export; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60).returncode == 0
