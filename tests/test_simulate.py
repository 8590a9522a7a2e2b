"""Simulated world sizes: one process as rank 0 of a fake world of N. Per-rank model-state bytes
match the analytic ZeRO prediction at N far beyond this machine; dp refuses clearly."""

from __future__ import annotations

from shardbench.cli import main
from tests.cells import run_cell_here


def test_torch_zero1_simulated_shows_whole_parameter_imbalance(tiny_cell) -> None:
    """At N=8 the tiny transformer's embedding alone exceeds 1/8 of the parameters, so the
    rank holding it keeps well over its share of optimizer state; ours stays at 1/N."""
    cells = {
        s: run_cell_here(tiny_cell(strategy=s, world_size=8, steps=1, warmup=1, simulate=True), run_id="sim")
        for s in ("torch-zero1", "zero1")
    }
    ours, theirs = (cells[s].mem_breakdown_bytes["optimizer"] for s in ("zero1", "torch-zero1"))
    ideal = cells["zero1"].predicted_mem_bytes["optimizer"]
    assert ours <= 1.01 * ideal < 1.5 * ideal < theirs


def test_dp_refuses_to_simulate(tmp_path, capsys) -> None:
    assert main(["run", "--strategy", "dp", "--simulate", "--out", str(tmp_path / "o")]) == 2
    assert "'dp' cannot be simulated" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
