"""Nothing already written is lost and no record field becomes a path: baselines and history are
built from parsed records and written atomically under a lock, a bad record is named and skipped
by every reader, and names that come from data stay inside their folder."""

from __future__ import annotations

import json
import threading
import warnings
from pathlib import Path

import pytest

from shardbench.cli import INTERNAL_ERROR, main
from shardbench.paths import atomic_write_text, inside, path_component
from shardbench.records import read_records
from shardbench.report.chart_types import slug
from shardbench.studies.baselines import manifest_path, save_baseline
from shardbench.studies.history import append_history
from tests.records import make_record


def _line(**overrides) -> str:
    return json.dumps(make_record(**overrides).to_json(), sort_keys=True)


def _run(path: Path, lines: list[str], *, final_newline: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "records.jsonl").write_text("\n".join(lines) + ("\n" if final_newline else ""))
    return path


def test_a_last_record_without_newline_is_not_glued_to_the_next_run(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", [_line(run_id="a", strategy=s) for s in ("ddp", "zero2")], final_newline=False)
    b = _run(tmp_path / "b", [_line(run_id="b", strategy=s) for s in ("ddp", "zero2")])
    dest = save_baseline([a, b], "x", root=tmp_path / "baselines")
    assert [(r.run_id, r.strategy) for r in read_records([dest], strict=True)] == [
        ("a", "ddp"), ("a", "zero2"), ("b", "ddp"), ("b", "zero2"),
    ]  # fmt: skip
    assert json.loads(manifest_path(dest).read_text())["records"] == 4


def test_a_partial_last_line_is_named_and_skipped_and_the_next_run_kept(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", [_line(run_id="a"), '{"run_id": "a", "worklo'], final_newline=False)
    b = _run(tmp_path / "b", [_line(run_id="b", strategy=s) for s in ("ddp", "zero2")])
    with pytest.warns(UserWarning, match=r"records.jsonl:2: not a record"):
        dest = save_baseline([a, b], "x", root=tmp_path / "baselines")
    assert [r.run_id for r in read_records([dest], strict=True)] == ["a", "b", "b"]


def test_a_failed_write_leaves_the_old_baseline_whole(tmp_path: Path, monkeypatch, capsys) -> None:
    root = tmp_path / "baselines"
    old = save_baseline([_run(tmp_path / "a", [_line(run_id="old")] * 3)], "x", root=root)
    before = (old.read_text(), manifest_path(old).read_text())

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("shardbench.paths.os.fsync", full_disk)
    new = _run(tmp_path / "b", [_line(run_id="new")])
    argv = ["baseline", "save", str(new), "--as", "x", "--root", str(tmp_path), "--force"]
    assert main(argv) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert (old.read_text(), manifest_path(old).read_text()) == before
    assert sorted(p.name for p in old.parent.iterdir()) == ["x.jsonl", "x.jsonl.lock", "x.manifest.json"]


def test_a_file_written_whole_gets_the_mode_of_any_new_file(tmp_path: Path) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    whole = tmp_path / "whole.txt"
    atomic_write_text(whole, "x")
    assert whole.stat().st_mode == plain.stat().st_mode  # not mkstemp's private 0600


def test_two_saves_at_once_never_mix(tmp_path: Path) -> None:
    root = tmp_path / "baselines"
    runs = [
        _run(tmp_path / w, [_line(run_id=w, strategy=s) for s in ("ddp", "zero1", "zero2")]) for w in "ab"
    ]
    outcomes: list[str] = []

    def save(run: Path) -> None:
        try:
            save_baseline([run], "race", root=root)
            outcomes.append("saved")
        except ValueError as e:
            outcomes.append(str(e))

    threads = [threading.Thread(target=save, args=(r,)) for r in runs for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("saved") == 1 and all("exists" in o for o in outcomes if o != "saved")
    saved = read_records([root / "cpu" / "race.jsonl"], strict=True)
    assert len(saved) == 3 and len({r.run_id for r in saved}) == 1
    manifest = json.loads(manifest_path(root / "cpu" / "race.jsonl").read_text())
    assert manifest["run_ids"] == [saved[0].run_id]


@pytest.mark.parametrize("device", ["/tmp/x", "../../y", ".."])
def test_a_record_field_never_becomes_a_path(tmp_path: Path, device: str) -> None:
    run = _run(tmp_path / "a", [_line(device=device)])
    with pytest.raises(ValueError, match="the records' device .* cannot name a file or folder"):
        save_baseline([run], "x", root=tmp_path / "baselines")
    assert not (tmp_path / "baselines").exists() or not any((tmp_path / "baselines").rglob("*.jsonl"))


def test_history_keeps_every_line_and_sets_a_partial_one_aside(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": 3, "trunc')
    with pytest.warns(UserWarning, match="moved a partial last line"):
        append_history(path, [{"a": 4}, {"a": 5}])
    assert [json.loads(line)["a"] for line in path.read_text().splitlines()] == [1, 2, 4, 5]
    assert Path(f"{path}.corrupt").read_text() == '{"a": 3, "trunc\n'
    with pytest.raises(IsADirectoryError):
        append_history(tmp_path, [{"a": 6}])


def test_nightly_refuses_a_history_directory_before_running(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("SHARDBENCH_HOME")  # the checkout's results/: its committed nightly-cpu baseline
    assert (
        main(["nightly", "--suite", "nightly-cpu", "--history", str(tmp_path), "--out", str(tmp_path / "n")])
        == 2
    )
    assert "is a directory" in capsys.readouterr().err
    assert not (tmp_path / "n").exists()


def test_trend_never_writes_where_a_history_line_points(tmp_path: Path, capsys) -> None:
    target = tmp_path / "elsewhere"
    line = {"suite": f"/../../../..{target}", "cell": "c", "time": "2026-12-01T00:00:00+0000", "metrics": {}}
    history = tmp_path / "hist" / "h.jsonl"
    history.parent.mkdir()
    history.write_text(json.dumps(line) + "\n")
    assert main(["trend", str(history)]) == 2
    assert "cannot name a file or folder" in capsys.readouterr().err
    assert not target.exists()


BAD_FIELDS = [
    ("env", None),
    ("peak_mem_bytes", "abc"),
    ("step_time_s", [1, 2]),
    ("tags", "x"),
    ("mem_breakdown_bytes", [1]),
    ("peak_mem_bytes", {"max": "abc"}),
]


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS)
def test_a_record_of_the_wrong_shape_is_named_and_skipped(tmp_path: Path, field: str, value) -> None:
    data = json.loads(_line(strategy="zero2"))
    data[field] = value
    path = tmp_path / "records.jsonl"
    path.write_text(_line() + "\n" + json.dumps(data) + "\n")
    with pytest.warns(UserWarning, match=rf"records.jsonl:2: not a record \({field}"):
        assert [r.strategy for r in read_records([path])] == ["ddp"]
    with pytest.raises(ValueError, match=rf"records.jsonl:2: not a record \({field}"):
        read_records([path], strict=True)


def test_compare_and_report_read_past_bad_records(tmp_path: Path) -> None:
    data = json.loads(_line(strategy="zero2"))
    data["env"] = None
    run = _run(tmp_path / "run", [_line(), json.dumps(data)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["compare", str(run), str(run), "--out", str(tmp_path / "cmp")]) == 0
        assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0


def test_a_bug_is_its_own_exit_code(monkeypatch, capsys) -> None:
    def broken(args) -> int:
        raise AttributeError("'NoneType' object has no attribute 'get'")

    monkeypatch.setattr("shardbench.cli.listing.cmd_env", broken)
    monkeypatch.setattr("shardbench.cli.cmd_env", broken)
    assert main(["env"]) == INTERNAL_ERROR != 1
    assert "internal error (AttributeError" in capsys.readouterr().err


def test_long_values_make_short_distinct_names_inside_their_root(tmp_path: Path) -> None:
    long_a = "hf:GPT2LMHeadModel-" + ":".join(f"k{i}={i * 1000}" for i in range(11))
    long_b = long_a.replace("k10=10000", "k10=10001")
    a, b = slug("breakdown", long_a), slug("breakdown", long_b)
    assert len(a) <= 96 and len(b) <= 96 and a != b
    assert slug("step_time", "examples/mymodel.py:factory") == "step_time-examples_mymodel.py_factory"
    assert path_component("..a") == "_..a"
    with pytest.raises(ValueError, match="is outside"):
        inside(tmp_path, "..", "y")
    atomic_write_text(tmp_path / "f", "one")
    atomic_write_text(tmp_path / "f", "two")
    assert (tmp_path / "f").read_text() == "two" and sorted(p.name for p in tmp_path.iterdir()) == ["f"]


@pytest.mark.parametrize("factory", ["exits", "build_exits"])
def test_user_code_that_exits_is_an_error_not_success(factory: str, tmp_path: Path, capsys) -> None:
    argv = [
        "run",
        "--workload",
        f"tests.user_models:{factory}",
        "--strategy",
        "ddp",
        "--out",
        str(tmp_path / "r"),
    ]
    assert main(argv) == 2
    assert "called sys.exit(0)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--timeout", "1e308"], "timeout (seconds) must be at most"),
        (["--world-size", "2,,2"], "an empty item in '2,,2'"),
        (["--workload", "hf:GPT2LMHeadModel", "--model-config", "n_layer=2,n_layer=3"], "given twice"),
        (
            [
                "--workload",
                "hf:GPT2LMHeadModel",
                "--model-config",
                "n_layer=2",
                "--model-config",
                "n_layer=3",
            ],
            "given twice",
        ),  # a repeated flag is merged, never silently dropped
    ],
)
def test_bad_flags_are_one_line_before_anything_runs(
    argv: list[str], needle: str, tmp_path: Path, capsys
) -> None:
    try:
        code = main(["run", "--strategy", "ddp", "--out", str(tmp_path / "r"), *argv])
    except SystemExit as e:  # argparse's own refusal
        code = e.code
    assert code == 2 and needle in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_compare_of_disjoint_runs_leaves_no_directory(tmp_path: Path, capsys) -> None:
    a = _run(tmp_path / "a", [_line(batch_size_per_rank=8)])
    b = _run(tmp_path / "b", [_line(batch_size_per_rank=16)])
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 2
    assert "batch_size 8 in the baseline, 16 now" in capsys.readouterr().err
    assert not (tmp_path / "cmp").exists()


def test_files_that_are_not_utf8_are_named(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_bytes(_line().encode() + b"\n" + b'{"run_id": "\xff"}\n')
    with pytest.warns(UserWarning, match=r"records.jsonl:2: not a record \(not UTF-8 text"):
        assert len(read_records([path])) == 1
    rules = tmp_path / "rules.toml"
    rules.write_bytes(b"[memory]\ntolerance_pct = \xff\n")
    from shardbench.studies.compare_rules import load_rules

    with pytest.raises(ValueError, match=r"--rules .*rules.toml: not UTF-8 text"):
        load_rules(rules)


def test_an_allocation_the_os_refuses_is_out_of_memory() -> None:
    from shardbench.harness.worker import _is_oom

    refused = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate memory: you tried "
        "to allocate 32212254720 bytes. Error code 12 (Cannot allocate memory)"
    )
    assert _is_oom(refused) and _is_oom(MemoryError()) and not _is_oom(RuntimeError("shape mismatch"))


@pytest.mark.parametrize("command", ["compare", "baseline", "export"])
def test_strict_refuses_a_bad_record(command: str, tmp_path: Path, capsys) -> None:
    data = json.loads(_line(strategy="zero2"))
    data["tags"] = "x"
    run = _run(tmp_path / "run", [_line(), json.dumps(data)])
    argv = {
        "compare": ["compare", str(run), str(run), "--out", str(tmp_path / "c")],
        "baseline": ["baseline", "save", str(run), "--as", "x", "--root", str(tmp_path / "b")],
        "export": ["export", "--format", "pytest-benchmark", str(run), "--out", str(tmp_path / "e.json")],
    }[command]
    assert main([*argv, "--strict"]) == 2
    assert "records.jsonl:2: not a record (tags should be an object" in capsys.readouterr().err


def test_resume_refuses_cells_that_are_not_the_runs(tmp_path: Path, capsys) -> None:
    """Without the run's own suite and flags, --resume would append another run's cells to it."""
    run = _run(tmp_path / "r", [_line(workload="transformer", preset="tiny", strategy="ddp")])
    before = (run / "records.jsonl").read_text()
    argv = ["run", "--resume", str(run), "--workload", "deepspeech2", "--preset", "tiny", "--strategy", "ddp"]
    assert main(argv) == 2
    assert "none of the 1 cell asked for is a cell of that run" in capsys.readouterr().err
    assert (run / "records.jsonl").read_text() == before


def test_resume_continues_the_runs_own_cells_without_its_flags(tmp_path: Path, capsys) -> None:
    """A run keeps the cells it was started with: ``--resume DIR`` alone continues them (here all
    are already ok, so nothing runs), and flags that make another set are refused."""
    from shardbench.cli.execute import CELLS_FILE
    from tests.cells import tiny_cell

    cell = tiny_cell(strategy="ddp", world_size=2, batch_size=8)
    run = _run(tmp_path / "r", [_line(strategy="ddp", requested_world_size=2, batch_size_per_rank=8)])
    (run / CELLS_FILE).write_text(json.dumps({"suite": "smoke", "cells": [cell.to_json()]}))
    assert main(["run", "--resume", str(run)]) == 0
    assert "1 of 1 cell already ok" in capsys.readouterr().err
    assert main(["run", "--resume", str(run), "--strategy", "zero2"]) == 2
    assert "continues that run's 1 cell; the flags given make a different set" in capsys.readouterr().err


def test_resume_reruns_an_interrupted_cell_under_the_runs_name(tmp_path: Path, monkeypatch) -> None:
    """An interrupted run, resumed with ``--resume DIR`` alone: the ok cell is skipped, the
    interrupted one runs again, and its record joins the run's id, name and tags."""
    from shardbench.cli.execute import CELLS_FILE
    from tests.cells import tiny_cell

    cells = [tiny_cell(strategy=s, world_size=2, batch_size=8) for s in ("ddp", "zero2")]
    shape = dict(requested_world_size=2, batch_size_per_rank=8)
    earlier = dict(run_id="night-1", name="night", tags={"k": "v"}, **shape)
    run = _run(
        tmp_path / "r",
        [_line(strategy="ddp", **earlier), _line(strategy="zero2", status="interrupted", **earlier)],
    )
    (run / CELLS_FILE).write_text(json.dumps({"suite": "smoke", "cells": [c.to_json() for c in cells]}))
    ran: list[str] = []

    def stand_in(cell, run_id):
        ran.append(cell.strategy)
        return make_record(strategy=cell.strategy, run_id=run_id, **shape)

    monkeypatch.setattr("shardbench.harness.runner.run_cell", stand_in)
    monkeypatch.setattr("shardbench.report.build.plot_all", lambda records, out_dir: {})
    assert main(["run", "--resume", str(run)]) == 0
    assert ran == ["zero2"]
    last = read_records([run])[-1]
    assert (last.strategy, last.status, last.run_id) == ("zero2", "ok", "night-1")
    assert (last.name, last.tags) == ("night", {"k": "v"})
