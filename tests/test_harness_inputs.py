"""Bad input is refused before anything runs, and records are never lost or corrupted: the
cases that need no running cell."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from shardbench.cli import main
from shardbench.harness import validate
from shardbench.harness.runner import new_run_id
from shardbench.records import SCHEMA, Record, RecordWriteError, append_record, read_records

TINY = [
    "run",
    "--workload",
    "transformer",
    "--preset",
    "tiny",
    "--strategy",
    "ddp",
    "--world-size",
    "2",
    "--steps",
    "2",
]


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_world_too_large_for_the_host_is_refused_with_the_way_out(tmp_path, capsys) -> None:
    err = _refused([*TINY[:-4], "--world-size", "10000", "--out", str(tmp_path / "o")], capsys)
    assert "world size 10000" in err and "--simulate" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("timeout", ["-5", "0", "nan", "inf"])
def test_timeouts_must_be_positive_and_finite(timeout, tmp_path, capsys) -> None:
    err = _refused([*TINY, f"--timeout={timeout}", "--out", str(tmp_path / "o")], capsys)
    assert "timeout" in err and timeout in err
    assert not (tmp_path / "o").exists()


def test_out_that_is_a_file_is_refused(tmp_path, capsys) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    assert "not a directory" in _refused([*TINY, "--out", str(f)], capsys)
    assert f.read_text() == "x"


@pytest.mark.parametrize("where", ["/proc/shardbench-out", "/sys/shardbench-out"])
def test_out_on_a_pseudo_filesystem_is_refused(where, capsys) -> None:
    assert "not writable" in _refused([*TINY, "--out", where], capsys)


def test_out_on_a_read_only_directory_is_refused(tmp_path, capsys, monkeypatch) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if (ro / "probe").touch() is None and (ro / "probe").exists():  # root ignores permissions
            (ro / "probe").unlink()
            monkeypatch.setattr(
                Path,
                "write_bytes",
                lambda self, data: (_ for _ in ()).throw(OSError(30, "Read-only file system")),
            )
        assert "not writable" in _refused([*TINY, "--out", str(ro / "run")], capsys)
    finally:
        ro.chmod(0o755)


def test_a_full_disk_is_refused_before_the_first_cell(tmp_path, capsys, monkeypatch) -> None:
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(validate.shutil, "disk_usage", lambda p: usage._replace(free=1 << 20))
    assert "MiB free" in _refused([*TINY, "--out", str(tmp_path / "o")], capsys)


def test_booleans_are_not_world_sizes(tmp_path, capsys) -> None:
    suite = tmp_path / "s.toml"
    suite.write_text("workloads = ['transformer']\npresets = ['tiny']\nworld_sizes = [true]\n")
    err = _refused(["run", "--suite", str(suite), "--out", str(tmp_path / "o")], capsys)
    assert "'world_sizes' must be a non-empty list of int, got True" in err
    suite.write_text("timeout_s = true\n")
    assert "'timeout_s' must be float" in _refused(["run", "--suite", str(suite)], capsys)
    with pytest.raises(ValueError, match="world size must be an integer"):
        validate.check_world_size(True, simulate=False)


def _record(run_id: str = "r", **kw) -> Record:
    base = dict(run_id=run_id, suite="s", workload="transformer", preset="tiny", params=1, strategy="ddp",
                world_size=2, requested_world_size=2, simulated=False, backend="gloo", device="cpu",
                precision="fp32", batch_size_per_rank=2, steps=2, warmup=0, status="ok")  # fmt: skip
    return Record(**{**base, **kw})


def test_a_truncated_last_line_is_moved_aside_before_appending(tmp_path) -> None:
    path = tmp_path / "records.jsonl"
    append_record(path, _record("a"))
    with path.open("a") as f:
        f.write('{"run_id": "b", "workl')  # a crash mid-write
    with pytest.warns(UserWarning, match="partial last line"):
        append_record(path, _record("c"))
    assert [r.run_id for r in read_records([path], strict=True)] == ["a", "c"]
    assert (tmp_path / "records.jsonl.corrupt").read_text() == '{"run_id": "b", "workl\n'


def test_a_record_write_error_is_clear(tmp_path) -> None:
    (tmp_path / "records.jsonl").mkdir()
    with pytest.raises(RecordWriteError, match="cannot write the record to .*records.jsonl"):
        append_record(tmp_path / "records.jsonl", _record())


def test_non_finite_numbers_are_written_as_null(tmp_path) -> None:
    path = tmp_path / "records.jsonl"
    append_record(path, _record(status="diverged", loss={"first": 2.0, "last": float("nan")},
                                step_time_s={"median": float("inf")}))  # fmt: skip
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    r = json.loads(text)
    assert r["loss"]["last"] is None and r["step_time_s"]["median"] is None and r["schema"] == SCHEMA


def test_report_names_file_and_line_of_bad_records_and_skips_them(tmp_path, capsys) -> None:
    path = tmp_path / "records.jsonl"
    append_record(path, _record("good"))
    with path.open("a") as f:
        f.write('42\n{"run_id": "x"}\n{"run_id": \n')
    append_record(path, _record("good2"))
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "rep")]) == 0
    err = capsys.readouterr().err
    assert f"{path}:2: not a record (expected a JSON object, got int)" in err
    assert f"{path}:3: not a record (missing field(s)" in err
    assert f"{path}:4: not a record (invalid JSON" in err
    assert main(["report", str(tmp_path), "--strict", "--out", str(tmp_path / "rep2")]) == 2
    assert f"{path}:2:" in capsys.readouterr().err


def test_old_records_without_schema_still_load(tmp_path) -> None:
    data = _record().to_json()
    del data["schema"], data["failure"]
    (tmp_path / "records.jsonl").write_text(json.dumps(data) + "\n")
    (r,) = read_records([tmp_path], strict=True)
    assert r.schema == 1


def test_run_ids_started_in_the_same_second_differ() -> None:
    ids = {new_run_id("smoke") for _ in range(20)}
    assert len(ids) == 20


def _stand_in_cells(monkeypatch, n: int = 2):
    """Cells whose run is a stand-in record (no processes): for the runner's own behaviour."""
    from shardbench.harness import runner
    from shardbench.harness.config import CellConfig

    def stand_in(cell, *, run_id):
        return _record(run_id, strategy=cell.strategy, world_size=cell.world_size)

    monkeypatch.setattr(runner, "run_cell", stand_in)
    return [
        CellConfig(workload="transformer", preset="tiny", strategy=s, world_size=2, batch_size=2)
        for s in ("ddp", "zero2")[:n]
    ]


def test_a_failing_after_record_step_is_reported_and_the_run_goes_on(tmp_path, monkeypatch, capsys) -> None:
    """The CLI rewrites the tables after each record; a table that cannot be written (a full
    disk) costs the table, never the run or its records."""
    from shardbench.harness.runner import run_cells

    def full_disk(records: list) -> None:
        raise OSError(28, "No space left on device")

    cells = _stand_in_cells(monkeypatch)
    outcome = run_cells(cells, out_dir=tmp_path, run_id="t", on_record=full_disk)
    assert [r.strategy for r in outcome.records] == ["ddp", "zero2"]
    assert len(read_records([tmp_path])) == 2
    assert capsys.readouterr().err.count("No space left on device; the run goes on") == 2


def test_repeats_are_measured_interleaved_across_a_group(tmp_path, monkeypatch) -> None:
    """A B A B, not A A B B: a drift of the machine's speed hits ddp and zero2 alike; a group of
    another world size follows the whole first group."""
    from dataclasses import replace

    from shardbench.harness.config import load_suite
    from shardbench.harness.runner import interleave_repeats, run_cells

    ran: list[tuple[str, int, int]] = []
    cells = _stand_in_cells(monkeypatch)
    monkeypatch.setattr(
        "shardbench.harness.runner.run_cell",
        lambda cell, run_id: ran.append((cell.strategy, cell.world_size, cell.repeat)) or _record(),
    )
    at4 = [replace(c, world_size=4) for c in cells]
    repeated = [replace(c, repeat=i) for c in (*cells, *at4) for i in (0, 1)]  # as a suite lists them
    run_cells(repeated, out_dir=tmp_path, run_id="t")
    assert ran == [
        ("ddp", 2, 0), ("zero2", 2, 0), ("ddp", 2, 1), ("zero2", 2, 1),
        ("ddp", 4, 0), ("zero2", 4, 0), ("ddp", 4, 1), ("zero2", 4, 1),
    ]  # fmt: skip
    nightly = interleave_repeats(load_suite("nightly-cpu").cells())
    first = [(c.workload, c.strategy, c.repeat) for c in nightly[:3]]
    assert first == [("transformer", "ddp", 0), ("transformer", "zero1", 0), ("transformer", "zero2", 0)]
    assert sorted(c.key() for c in nightly) == sorted(c.key() for c in load_suite("nightly-cpu").cells())


def test_a_record_write_error_stops_the_run_at_once(tmp_path, monkeypatch) -> None:
    from shardbench.harness.runner import run_cells

    cells = _stand_in_cells(monkeypatch)
    (tmp_path / "records.jsonl").mkdir()  # appending fails
    ran: list[str] = []
    monkeypatch.setattr(
        "shardbench.harness.runner.run_cell", lambda cell, run_id: ran.append(cell.strategy) or _record()
    )
    with pytest.raises(RecordWriteError):
        run_cells(cells, out_dir=tmp_path, run_id="t")
    assert ran == ["ddp"]  # the second cell never ran


def test_resume_skips_cells_with_an_ok_record(tmp_path, monkeypatch) -> None:
    from shardbench.harness.runner import done_keys, run_cells
    from shardbench.harness.validate import plan_cells

    cells = plan_cells(_stand_in_cells(monkeypatch))
    append_record(tmp_path / "records.jsonl", _record(strategy="ddp", world_size=2))
    append_record(tmp_path / "records.jsonl", _record(strategy="zero2", world_size=2, status="interrupted"))
    outcome = run_cells(cells, out_dir=tmp_path, run_id="t", skip=done_keys(tmp_path))
    assert outcome.skipped == 1 and [r.strategy for r in outcome.records] == ["zero2"]
