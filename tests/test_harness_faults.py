"""Every failure path of the harness, by injection (SHARDBENCH_FAULT): each fault is recorded
with its status and the rank that caused it, records stay valid JSON, the next cell still runs,
and no rank process outlives the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardbench.harness.config import CellConfig
from shardbench.harness.launch import launcher_dir
from shardbench.harness.runner import run_cells
from shardbench.harness.validate import plan_cells
from shardbench.records import read_records
from tests.procs import worker_processes

#: one worker runs this module: its module-scoped fixture runs once (pytest-xdist, loadgroup)
pytestmark = pytest.mark.xdist_group("test_harness_faults")

FAULTS = ",".join(
    ["crash:rank=1:strategy=ddp", "hang:rank=1:strategy=zero1", "nan:rank=1:step=1:strategy=zero2",
     "oom:rank=1:strategy=torch-zero1"]
)  # fmt: skip


def _cell(strategy: str, **kw) -> CellConfig:
    base = dict(workload="transformer", preset="tiny", strategy=strategy, world_size=2, steps=2, warmup=0,
                batch_size=2, timeout_s=120.0)  # fmt: skip
    return CellConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    out = tmp_path_factory.mktemp("faults")
    mp = pytest.MonkeyPatch()
    mp.setenv("SHARDBENCH_FAULT", FAULTS)
    try:
        cells = plan_cells(
            [
                _cell("ddp"),
                _cell("zero1", timeout_s=15.0),
                _cell("zero2"),
                _cell("torch-zero1"),
                _cell("fsdp2-zero2"),
            ]
        )
        outcome = run_cells(cells, out_dir=out, run_id="faults")
    finally:
        mp.undo()
    return out, {r.strategy: r for r in outcome.records}


@pytest.mark.parametrize(
    ("strategy", "status", "signal", "step"),
    [
        ("ddp", "error", "SIGKILL", None),
        ("zero1", "timeout", None, None),
        ("zero2", "diverged", None, 1),
        ("torch-zero1", "oom", None, 0),
    ],  # fmt: skip
)
def test_each_fault_is_recorded_and_blames_rank_1(fault_run, strategy, status, signal, step) -> None:
    _, records = fault_run
    r = records[strategy]
    assert r.status == status, r.error
    assert r.failure["rank"] == 1, r.error
    assert r.failure["signal"] == signal
    if step is not None:
        assert r.failure["step"] == step
    assert r.error.startswith("rank 1")


def test_a_hang_says_where_the_rank_is_stuck(fault_run) -> None:
    r = fault_run[1]["zero1"]
    assert "stuck in" in r.error and "faults.py" in r.error.splitlines()[0], r.error


def test_the_cell_after_the_faults_runs(fault_run) -> None:
    assert fault_run[1]["fsdp2-zero2"].status == "ok"


def test_records_are_strict_json_without_nan(fault_run) -> None:
    out, _ = fault_run
    lines = (out / "records.jsonl").read_text().splitlines()
    assert len(lines) == 5

    def refuse(token: str) -> None:
        raise AssertionError(f"non-JSON literal {token} in a record")

    for line in lines:
        json.loads(line, parse_constant=refuse)
    diverged = next(r for r in read_records([out]) if r.status == "diverged")
    assert diverged.loss is None or all(v is None or v == v for v in diverged.loss.values())


def test_no_rank_outlives_the_faults(fault_run) -> None:
    private = launcher_dir()  # where the cells' directories were, a marker for their ranks' logs
    assert worker_processes(str(private)) == []
    assert list(private.glob("cell-*")) == []  # the cells' temporary directories


@pytest.mark.parametrize("strategy", ["ddp", "zero2"])
def test_a_rank_that_exits_is_blamed_not_the_peer_it_left(tmp_path: Path, strategy: str) -> None:
    """Rank 1 ends with os._exit(3) mid-step; rank 0 then fails in a collective ("connection
    reset by peer"). The record blames rank 1, with its exit code."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SHARDBENCH_FAULT", "exit:rank=1:step=1")
    try:
        (record,) = run_cells(plan_cells([_cell(strategy)]), out_dir=tmp_path, run_id="exit").records
    finally:
        mp.undo()
    assert record.status == "error" and record.failure["rank"] == 1, record.error
    assert record.error.startswith("rank 1: exited with code 3"), record.error


def test_a_rank_the_oom_killer_ends_is_recorded_as_out_of_memory(tmp_path: Path, monkeypatch) -> None:
    """A rank killed by SIGKILL while the kernel's count of OOM kills rises (its OOM killer
    ran: played here by the count) is an "oom" cell, which a size search reads as "does not
    fit"; the same death with the count still (a ``kill -9``) stays an error, as above."""
    from shardbench.harness import launch

    kills = iter(range(100))
    monkeypatch.setattr(launch, "oom_kills", lambda: next(kills))
    monkeypatch.setenv("SHARDBENCH_FAULT", "crash:rank=1")
    (record,) = run_cells(plan_cells([_cell("ddp", steps=1)]), out_dir=tmp_path, run_id="oom-kill").records
    assert record.status == "oom" and record.failure["rank"] == 1, record.error
    assert record.failure["signal"] == "SIGKILL"
    killed = "rank 1: killed by SIGKILL while the kernel's OOM killer ran"
    assert record.error.startswith(killed), record.error


def test_the_oom_kill_count_is_read_from_the_kernel(tmp_path: Path, monkeypatch) -> None:
    from shardbench.harness import launch

    vmstat = tmp_path / "vmstat"
    monkeypatch.setattr(launch, "VMSTAT", vmstat)
    vmstat.write_text("nr_free_pages 10\noom_kill 7\npgfault 3\n")
    assert launch.oom_kills() == 7
    vmstat.write_text("nr_free_pages 10\n")  # a kernel older than the counter
    assert launch.oom_kills() is None
    vmstat.unlink()  # not Linux
    assert launch.oom_kills() is None


def test_slow_lengthens_every_timed_step_by_its_fraction(monkeypatch) -> None:
    """``slow:frac=F`` adds F times a step's own time to the step, inside its timing: on a clock
    that only the step and the sleep move, a 0.2 s step is timed 0.2 x 1.15 s, exactly."""
    import time

    import torch

    from shardbench.harness.faults import faults_from_env
    from shardbench.harness.phases import CellSteps

    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(time, "sleep", lambda s: now.__setitem__(0, now[0] + s))

    class Stub:
        def train_step(self, model, optimizer, inputs, loss):
            now[0] += 0.2
            return torch.tensor(1.0)

    def seconds(fault) -> float:
        steps = CellSteps(
            cell=_cell("zero2"), strategy=Stub(), workload=None, model=None, optimizer=None,
            device=torch.device("cpu"), rank=0, data_ranks=range(1), autocast_dtype=None, fault=fault,
        )  # fmt: skip
        return [steps.run(None, timing=True)[1] for _ in range(3)][-1]

    (slow,) = faults_from_env({"SHARDBENCH_FAULT": "slow:frac=0.15:strategy=zero2"})
    assert (slow.kind, slow.frac, slow.strategy) == ("slow", 0.15, "zero2")
    assert slow.applies_to("zero2") and not slow.applies_to("ddp")
    assert seconds(slow) == pytest.approx(0.23, abs=1e-12)
    assert seconds(None) == pytest.approx(0.2, abs=1e-12)
    (crash,) = faults_from_env({"SHARDBENCH_FAULT": "crash"})
    assert seconds(crash) == pytest.approx(0.2, abs=1e-12)  # only slow slows (crash is due at rank 1)
    for bad, says in [
        ("slow", "slow needs frac=F"),
        ("slow:frac=0", "got 'frac=0'"),
        ("slow:frac=11", "got 'frac=11'"),
        ("slow:rank=1:frac=0.1", "got 'rank=1'"),
        ("crash:frac=0.1", "got 'frac=0.1'"),
    ]:
        with pytest.raises(ValueError, match=says):
            faults_from_env({"SHARDBENCH_FAULT": bad})
