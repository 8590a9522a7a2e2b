"""``shardbench nightly`` end to end on a tiny suite: a named, tagged, repeated baseline run is
saved, then two nights in a row compare with it and exit 0, each appending to the history."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from shardbench.cli import main
from shardbench.records import read_records
from tests.probes import seed_probes

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
    monkeypatch.setenv("SHARDBENCH_HOME", str(tmp_path))
    seed_probes(tmp_path)
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
        # the verdict names what changed since the baseline: here nothing, the same checkout
        (first, *_) = data["provenance"]["lines"]
        assert first.startswith("since the baseline: ") and first in capsys.readouterr().out
        assert first.endswith("no version or machine change"), first
    # refused before running: a directory holding a night (or anything), a bad rules file
    assert main(["nightly", "--suite", str(suite), "--out", str(tmp_path / "n1")]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    assert main(["nightly", "--suite", str(suite), "--out", str(tmp_path / "busy")]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    rules = tmp_path / "rules.toml"
    rules.write_text("[memory]\ntolerance = 1\n")
    assert main(["nightly", "--suite", str(suite), "--rules", str(rules), "--out", str(tmp_path / "n3")]) == 2
    assert "unknown key(s) tolerance" in capsys.readouterr().err and not (tmp_path / "n3").exists()
    lines = [json.loads(line) for line in history.read_text().splitlines()]
    assert len(lines) == 4 and {line["verdict"] for line in lines} == {"unchanged"}
    assert {line["baseline"] for line in lines} == {"nightly-test"}
    peak = lines[0]["metrics"]["peak_mem_bytes"]
    assert peak["value"] == peak["baseline"] and peak["low"] < peak["value"] < peak["high"]
    mfu = lines[0]["metrics"]["mfu"]  # drawn in the trend, never gated
    assert mfu["verdict"] == "not gated" and 0 < mfu["value"] < 1 and mfu["unit"] == "fraction"
    assert (tmp_path / "n1" / "trend" / "trend-mfu.png").is_file()
    night = read_records([tmp_path / "n1"])
    assert all(r.tags["nightly"] == "nightly-test" and r.name.startswith("nightly-test-") for r in night)


def test_nightly_refuses_before_running(tmp_path: Path, baselines: Path, capsys) -> None:
    """No baseline, an empty baseline, a bad suite, a bad repeat: exit 2 with the reason,
    nothing run."""
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
    (baselines / "cpu").mkdir(parents=True)
    (baselines / "cpu" / "nightly-test.jsonl").write_text("")
    assert main(["nightly", "--suite", str(suite), "--out", str(out)]) == 2
    assert "holds no records" in capsys.readouterr().err
    assert not out.exists()


def test_suite_max_size_tables_are_validated_as_max_size_flags(tmp_path: Path) -> None:
    from shardbench.cli.common import UsageError
    from shardbench.cli.suite_searches import resolve_searches
    from shardbench.harness.config import load_suite

    suite = tmp_path / "s.toml"
    suite.write_text(
        SUITE + '[[max_size]]\nworkload = "transformer"\nstrategy = ["ddp", "zero2"]\nworld_size = [4]\n'
        'budget = "1GiB"\nfake = true\n'
    )
    spec = load_suite(str(suite))
    (search,) = resolve_searches(spec)
    assert [c.strategy for c in search.cells] == ["ddp", "zero2"] and search.budget == 1 << 30
    assert search.cells[0].fake and search.vary == "params"
    bad = replace(spec, max_size=({**spec.max_size[0], "ladder": ["tiny", "nope"]},))
    with pytest.raises(UsageError, match=r"\[\[max_size\]\] #1: .*unknown preset 'nope'"):
        resolve_searches(bad)


def test_the_shipped_nightly_suites_plan() -> None:
    """nightly-cpu's cells plan on this machine (its [[max_size]] tables too, if it has any);
    nightly-gpu's cells parse (planning needs CUDA) and its searches are max-size flags."""
    from shardbench.cli.suite_searches import resolve_searches
    from shardbench.harness.config import load_suite
    from shardbench.harness.validate import plan_cells

    cpu = load_suite("nightly-cpu")
    cells = plan_cells(cpu.cells())
    assert {c.workload for c in cells} == {"transformer", "imagegpt", "swav", "deepspeech2"}
    timed = [c for c in cells if not c.simulate]
    assert timed and all(c.steps >= 5 for c in timed) and {c.repeat for c in timed} == {0, 1}
    assert all(c.world_size == 8 for c in cells if c.simulate)
    peers = {"fairscale-zero1", "fairscale-zero2", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3"}
    assert peers <= {c.strategy for c in timed} and not peers & {c.strategy for c in cells if c.simulate}
    resolve_searches(cpu)
    gpu = load_suite("nightly-gpu")
    assert gpu.device == "cuda" and gpu.cells() and len(gpu.max_size) == 1
    assert {"workload", "strategy", "budget"} <= set(gpu.max_size[0])
