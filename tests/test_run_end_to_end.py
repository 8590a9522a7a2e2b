"""`shardbench run` end to end on the tiny preset, failure handling, and torchrun."""

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from shardbench.cli import main
from shardbench.core_binding import cores_each
from shardbench.harness.config import CellConfig, available_cores
from shardbench.metrics.timing import summarize
from shardbench.models.registry import get_workload
from shardbench.prediction.bare_pool import KEPT, bare_key, pool_path
from shardbench.prediction.model_error import read_checks
from shardbench.prediction.record_step_time import BARE_SOURCE, replay_usable
from shardbench.records import read_records
from tests.cells import tiny_cell

#: one worker runs this module and tests/test_job.py: the smoke suite's local run (conftest.py)
#: runs once for both (pytest-xdist, loadgroup)
pytestmark = pytest.mark.xdist_group("smoke_suite")


@pytest.fixture(scope="module")
def smoke_run(smoke_suite_run: dict[str, object]) -> Path:
    """The smoke suite, run on this machine: every workload under ddp and zero2 at N = 2."""
    assert smoke_suite_run["code"] == 0
    return smoke_suite_run["out"]


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory) -> Path:
    """The smoke suite's transformer with DataParallel named on the CPU: it runs, flagged
    single-device (the suite leaves it out there)."""
    out = tmp_path_factory.mktemp("dp")
    smoke_dp = ["--suite", "smoke", "--workload", "transformer", "--strategy", "dp", "--steps", "1"]
    assert main(["run", *smoke_dp, "--warmup", "0", "--out", str(out)]) == 0
    return out


def _placed(ranks: int) -> dict[str, int]:
    """A launched CPU cell's placement: its ranks, the host's cores, and the cores each rank
    was bound to (absent where binding is off)."""
    each = cores_each(ranks)
    return {"ranks": ranks, "cores": available_cores(), **({"bound_cores_each": each} if each else {})}


def test_run_writes_records_and_tables(smoke_run: Path) -> None:
    records = read_records([smoke_run])
    n_parameter_tensors = {
        r.workload: sum(p.requires_grad for p in get_workload(r.workload).build("tiny").parameters())
        for r in records
    }
    cells = {
        (c["workload"], c["strategy"]): c for c in json.loads((smoke_run / "cells.json").read_text())["cells"]
    }
    assert {(r.workload, r.strategy): r.status for r in records} == {cell: "ok" for cell in cells}
    assert {s for _, s in cells} == {"ddp", "zero2"} and len(cells) > 2
    for name in ("table.md", "table.csv"):
        assert (smoke_run / name).stat().st_size > 0
    assert len((smoke_run / "table.csv").read_text().strip().splitlines()) == 1 + len(records)
    for r in records:
        assert r.step_time_s["n"] == cells[r.workload, r.strategy]["steps"] and r.step_time_s["median"] > 0
        assert r.step_times_s and summarize(r.step_times_s) == r.step_time_s  # each step, kept
        assert set(r.step_phases_s) == {"forward", "backward", "optimizer"}  # the terms, measured
        assert r.env["torch"] and r.peak_mem_bytes["max"] > 0
        # its two ranks on this host's cores, each bound to its own block of them (core_binding)
        assert r.placement == _placed(2)
        assert (
            sum(r.mem_breakdown_bytes.values())
            == r.peak_mem_bytes["tracked_per_rank"][
                r.peak_mem_bytes["per_rank"].index(r.peak_mem_bytes["max"])
            ]
        )
        # throughput: one rank's FLOPs over the slowest rank's median step, against this CPU's
        # measured peak at the rank's threads; tokens/s beside samples/s
        flops, median = r.flops_per_step, r.step_time_s["median"]
        assert r.achieved_flops_per_s["model"] == pytest.approx(flops.model / median)
        assert (
            r.peak_flops_per_s["kind"] == "measured" and r.peak_flops_per_s["threads"] == r.threads_per_rank
        )
        assert 0 < r.mfu == pytest.approx(r.achieved_flops_per_s["model"] / r.peak_flops_per_s["flops_per_s"])
        if flops.tokens_per_sample is None:  # images, audio: samples/s alone
            assert r.workload in ("swav", "deepspeech2") and r.tokens_per_s is None, r.workload
        else:
            assert r.tokens_per_s == pytest.approx(r.samples_per_s * flops.tokens_per_sample)
        # every measured cell carries the step-time model's prediction, over this CPU's gloo profile
        p = r.predicted_step_time
        assert p.network == "gloo"
        terms = p.compute + p.update + p.exposed_comm + p.call_overhead + p.buffer_memory
        assert p.step == pytest.approx(terms)
        # its compute: the step's own operator calls replayed at a rank's threads, every one of them
        c = r.compute_replay
        assert c.threads == r.threads_per_rank and c.calls > c.distinct > 0
        assert c.seconds > 0 and replay_usable(c)
        if r.workload == "transformer":  # every call of its step replays (a few of swav's do not)
            assert c.unreplayed_calls == 0
        # but the prediction's compute is the model's own pass, timed on the cell's ranks before
        # the strategy wrapped it (the slowest rank's median), and its update counts the tensors
        # the rank's optimizer steps over: ddp's every parameter, zero2's fewer pieces of them
        b = r.bare_compute
        assert b.threads == r.threads_per_rank and b.repeats >= 3 and b.seconds > 0
        assert p.compute_source.startswith(BARE_SOURCE) and p.compute_basis == "measured"
        # the median of this machine's newest timings of the same bare model at the same
        # placement, this cell's included: each strategy's cell times the same model
        pooled_cells = json.loads(pool_path().read_text())["entries"][bare_key(r)]
        kept = [t for e in pooled_cells for t in e["passes"]]
        assert len(b.pass_seconds) == b.repeats and b.seconds == statistics.median(b.pass_seconds)
        assert p.compute == b.pooled_seconds and 1 <= b.pooled_cells <= len(pooled_cells) <= KEPT
        assert b.repeats <= b.pooled_passes <= len(kept) and min(kept) <= p.compute <= max(kept)
        assert p.update > 0
        if r.strategy == "ddp":
            assert r.optimizer_tensors == n_parameter_tensors[r.workload]
        # the elements of each tensor stepped, on the rank that updates the most (the count is the
        # rank that steps the most tensors): ddp's every parameter's, zero2's pieces of its share
        elements = r.optimizer_tensor_elements
        assert 0 < len(elements) <= r.optimizer_tensors and r.optimizer_dtensor_shapes is None
        if r.strategy == "ddp":
            assert sum(elements) == r.params
        else:
            assert r.params / 2 <= sum(elements) < r.params
        # the collectives the loss issues itself, counted in the bare pass, which holds them
        own, counted = b.collectives, r.comm_per_step["ops"]
        if r.workload == "swav":  # its Sinkhorn sums the codes over the ranks in forward
            assert 0 < own["all_reduce"]["calls"] < counted["all_reduce"]["calls"]
        else:
            assert own == {}, r.workload
    tensors = {(r.workload, r.strategy): r.optimizer_tensors for r in records}
    for workload in {r.workload for r in records}:
        assert 0 < tensors[workload, "zero2"] < tensors[workload, "ddp"], workload
    # each cell checked the model twice, each check kept apart by its compute's basis: its own
    # prediction (the timed pass), and the one a plan would have made of it (the replay), so a
    # plan's interval comes from the replay's own error
    checked = {(c["workload"], c["strategy"], c.get("compute")) for c in read_checks()}
    for r in records:
        assert {(r.workload, r.strategy, b) for b in ("measured", "replayed")} <= checked, r.workload
    # a command counts a step once and hands the count on (harness/counting.py): every cell of
    # a workload carries that one count (that it holds whatever the strategy: test_dp_on_cpu...)
    for workload in {r.workload for r in records}:
        flops = {
            (r.flops_per_step.model, r.flops_per_step.hardware) for r in records if r.workload == workload
        }
        assert len(flops) == 1, workload


def test_dp_on_cpu_is_recorded_as_single_device(dp_run: Path, smoke_run: Path) -> None:
    (dp,) = read_records([dp_run])
    assert dp.strategy == "dp" and dp.status == "ok", dp.error
    assert dp.world_size == 1 and dp.requested_world_size == 2
    assert "pass-through" in dp.note
    # the math of a rank's step is the same whatever the strategy shards, or does not
    (ddp,) = [r for r in read_records([smoke_run]) if (r.workload, r.strategy) == ("transformer", "ddp")]
    assert dp.flops_per_step.model == ddp.flops_per_step.model > 0
    assert dp.flops_per_step.hardware == ddp.flops_per_step.hardware


def test_ddp_model_states_are_16_bytes_per_parameter(smoke_run: Path) -> None:
    """fp32 AdamW under DDP with gradient_as_bucket_view: 4 (param) + 4 (grad) + 8 (Adam)."""
    (ddp,) = [r for r in read_records([smoke_run]) if (r.workload, r.strategy) == ("transformer", "ddp")]
    assert ddp.world_size == 2 and ddp.strategy_settings["gradient_as_bucket_view"] is True
    bd = ddp.mem_breakdown_bytes
    model_state = bd["params"] + bd["grads"] + bd["optimizer"]
    assert model_state == pytest.approx(16 * ddp.params, rel=0.01)
    assert ddp.predicted_mem_bytes["total"] == 16 * ddp.params


def _cell(**kw) -> CellConfig:
    return tiny_cell(**{**dict(steps=1, warmup=0, timeout_s=60), **kw})


def test_worker_runs_under_torchrun(tmp_path: Path) -> None:
    cell = _cell(steps=2, warmup=1)
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "shardbench.harness.worker",
            "--cell",
            json.dumps(cell.to_json()),
            "--out",
            str(tmp_path),
            "--run-id",
            "tr",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = read_records([tmp_path])
    assert record.status == "ok" and record.world_size == 2 and record.run_id == "tr"
    assert len(record.peak_mem_bytes["per_rank"]) == 2
