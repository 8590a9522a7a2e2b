"""``--fake``: planning under FakeTensorMode must see exactly the memory a real run allocates."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardbench.cli import main
from shardbench.metrics.memory import CATEGORIES
from tests.cells import run_cell_here


@pytest.mark.parametrize(
    ("strategy", "precision"),
    [
        ("ddp", "fp32"),
        ("zero2", "fp32"),
        ("fsdp2-zero2", "fp32"),
        ("zero2", "bf16"),
        ("zero1", "bf16"),
        ("zero3", "fp32"),
        ("zero3", "bf16"),
    ],
)
def test_fake_peak_equals_the_real_peak_per_category(strategy: str, precision: str, tiny_cell) -> None:
    """Same simulated world (N=4), once with real tensors, once with fake ones (both in this
    process: tests/cells.py); bf16 converts the model's dtype, which --fake must plan too."""
    base = tiny_cell(
        strategy=strategy, world_size=4, batch_size=4, steps=1, warmup=2, simulate=True, precision=precision
    )
    real = run_cell_here(base)
    fake = run_cell_here(replace(base, fake=True))
    assert real.status == fake.status == "ok", (real.error, fake.error)
    assert fake.fake and not real.fake and fake.step_time_s is None and fake.loss is None
    for c in CATEGORIES:
        assert fake.mem_breakdown_bytes[c] == pytest.approx(real.mem_breakdown_bytes[c], rel=0.01, abs=64), c
    assert fake.peak_mem_bytes["max"] == pytest.approx(real.peak_mem_bytes["max"], rel=0.01)
    if strategy == "ddp":  # DDP cannot be built on fake tensors: the record says how it was planned
        assert "explicit gradient buckets" in fake.strategy_settings["planned"]


def test_fake_refuses_workloads_with_data_dependent_shapes(capsys) -> None:
    assert main(["run", "--workload", "deepspeech2", "--strategy", "zero2", "--fake"]) == 2
    assert "cannot be planned with --fake" in capsys.readouterr().err
