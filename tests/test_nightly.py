"""``shardbench nightly`` end to end on a tiny suite: a named, tagged, repeated baseline run is
saved, then two nights in a row compare with it and exit 0, each appending to the history."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cli import main
from bench.harness.records import read_records

SUITE = """
description = "nightly test: two simulated tiny cells, memory compared (3 timed steps)"
workloads = ["transformer"]
strategies = ["ddp", "zero2"]
world_sizes = [4]
presets = ["tiny"]
batch_sizes = [4]
steps = 3
warmup = 1
simulate = true
timeout_s = 120
"""


@pytest.fixture
def baselines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import bench.studies.baselines as module

    monkeypatch.setattr(module, "BASELINES_DIR", tmp_path / "baselines")
    return tmp_path / "baselines"


def test_nightly_twice_against_a_saved_baseline(tmp_path: Path, baselines: Path, capsys) -> None:
    suite = tmp_path / "nightly-test.toml"
    suite.write_text(SUITE)
    first = tmp_path / "first"
    args = ["run", "--suite", str(suite), "--name", "first", "--tag", "branch=main", "--repeat", "2"]
    assert main([*args, "--out", str(first)]) == 0
    records = read_records([first])
    assert sorted((r.strategy, r.repeat) for r in records) == [
        ("ddp", 0),
        ("ddp", 1),
        ("zero2", 0),
        ("zero2", 1),
    ]
    assert {r.name for r in records} == {"first"} and all(r.tags == {"branch": "main"} for r in records)
    assert all(r.run_id.split("-")[2] == "first" for r in records)
    assert main(["baseline", "save", str(first), "--as", "nightly-test"]) == 0

    history = tmp_path / "history" / "nightly-test.jsonl"
    for night in ("n1", "n2"):
        code = main(
            ["nightly", "--suite", str(suite), "--out", str(tmp_path / night), "--history", str(history)]
        )
        assert code == 0, capsys.readouterr()
        assert (tmp_path / night / "compare.md").is_file() and (tmp_path / night / "index.html").is_file()
        data = json.loads((tmp_path / night / "compare.json").read_text())
        assert data["counts"]["unchanged"] == 2, data
    lines = [json.loads(line) for line in history.read_text().splitlines()]
    assert len(lines) == 4 and {line["verdict"] for line in lines} == {"unchanged"}
    assert {line["baseline"] for line in lines} == {"nightly-test"}
    peak = lines[0]["metrics"]["peak_mem_bytes"]
    assert peak["value"] == peak["baseline"] and peak["low"] < peak["value"] < peak["high"]
    night = read_records([tmp_path / "n1"])
    assert all(r.tags["nightly"] == "nightly-test" and r.name.startswith("nightly-test-") for r in night)


def test_nightly_refuses_before_running(tmp_path: Path, baselines: Path, capsys) -> None:
    """No baseline, a bad rules file, a bad suite: exit 2 with the reason, nothing run."""
    suite = tmp_path / "nightly-test.toml"
    suite.write_text(SUITE)
    out = tmp_path / "out"
    assert main(["nightly", "--suite", str(suite), "--out", str(out)]) == 2
    assert "shardbench baseline save RUN --as nightly-test" in capsys.readouterr().err
    assert main(["nightly", "--suite", "nightly-nope", "--out", str(out)]) == 2
    assert "unknown suite 'nightly-nope'" in capsys.readouterr().err
    assert main(["run", "--suite", str(suite), "--repeat", "0"]) == 2
    assert "--repeat must be an integer from 1 to 100" in capsys.readouterr().err
    assert not out.exists()


def test_suite_max_size_tables_are_validated_as_max_size_flags(tmp_path: Path) -> None:
    from bench.cli.common import UsageError
    from bench.cli.nightly import _max_size_search
    from bench.harness.config import load_suite

    suite = tmp_path / "s.toml"
    suite.write_text(
        SUITE + '[[max_size]]\nworkload = "transformer"\nstrategy = ["ddp", "zero2"]\nworld_size = [4]\n'
        'budget = "1GiB"\nfake = true\n'
    )
    (table,) = load_suite(str(suite)).max_size
    args, cells, budget, ladder = _max_size_search(table, 0, "s")
    assert [c.strategy for c in cells] == ["ddp", "zero2"] and budget == 1 << 30 and cells[0].fake
    with pytest.raises(UsageError, match=r"\[\[max_size\]\] #1: .*unknown preset 'nope'"):
        _max_size_search({**table, "ladder": ["tiny", "nope"]}, 0, "s")
