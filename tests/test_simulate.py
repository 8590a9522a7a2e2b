"""Simulated world sizes: one process as rank 0 of a fake world of N. Per-rank model-state bytes
match the analytic ZeRO prediction at N far beyond this machine; dp refuses clearly."""

from __future__ import annotations

import pytest

from bench.cli import main
from bench.config import CellConfig
from bench.launch import run_cell


@pytest.mark.parametrize("world_size", [8, 64])
@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2"])
def test_simulated_model_states_match_the_zero_formula(strategy: str, world_size: int) -> None:
    r = run_cell(
        CellConfig(
            workload="transformer",
            preset="tiny",
            strategy=strategy,
            world_size=world_size,
            steps=1,
            warmup=1,
            simulate=True,
        ),
        run_id="sim",
    )
    assert r.status == "ok", r.error
    assert r.simulated and r.backend == "fake" and r.world_size == world_size
    assert r.samples_per_s is None and "step time excludes communication" in r.note
    measured, predicted = r.mem_breakdown_bytes, r.predicted_mem_bytes
    # optimizer: AdamW's two moments for this rank's share (+ a 4-byte step counter per piece)
    assert measured["optimizer"] == pytest.approx(predicted["optimizer"], rel=0.01)
    assert measured["params"] == pytest.approx(predicted["params"], rel=0.01)  # (+ flat padding)
    if strategy == "zero2":  # the peak is in the forward, before any gradient shard exists
        assert measured["grads"] <= predicted["grads"]
    else:
        assert measured["grads"] == pytest.approx(predicted["grads"], rel=0.01)


def test_torch_zero1_simulated_shows_whole_parameter_imbalance() -> None:
    """At N=8 the tiny transformer's embedding alone exceeds 1/8 of the parameters, so the
    rank holding it keeps well over its share of optimizer state; ours stays at 1/N."""
    cells = {
        s: run_cell(
            CellConfig(
                workload="transformer",
                preset="tiny",
                strategy=s,
                world_size=8,
                steps=1,
                warmup=1,
                simulate=True,
            ),
            run_id="sim",
        )
        for s in ("torch-zero1", "zero1")
    }
    ours, theirs = (cells[s].mem_breakdown_bytes["optimizer"] for s in ("zero1", "torch-zero1"))
    ideal = cells["zero1"].predicted_mem_bytes["optimizer"]
    assert ours <= 1.01 * ideal < 1.5 * ideal < theirs


def test_dp_refuses_to_simulate(tmp_path, capsys) -> None:
    assert main(["run", "--strategy", "dp", "--simulate", "--out", str(tmp_path / "o")]) == 2
    assert "'dp' cannot be simulated" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
