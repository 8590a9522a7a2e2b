"""The four workloads: reference parameter counts (meta device), ladders, tiny presets that
learn, and runs under ddp and zero2 at world size 2 through the harness's rank code (on a shared
gloo world: tests/cells.py)."""

from __future__ import annotations

import pytest
import torch

from models.registry import get_workload, workload_names
from models.swav import WideResNet50Trunk
from tests.cells import run_cell_here

WORKLOADS = ["transformer", "imagegpt", "swav", "deepspeech2"]


def test_all_four_are_registered() -> None:
    assert workload_names() == WORKLOADS


@pytest.mark.parametrize(
    "workload, preset, reference",
    [
        ("transformer", "base", 109.5e6),  # bert-base encoder + pooler (+ our 2-way head)
        ("transformer", "large", 335.1e6),
        ("imagegpt", "igpt-s", 76e6),
        ("imagegpt", "igpt-m", 455e6),
        ("imagegpt", "igpt-l", 1362e6),  # the Image GPT paper's figure
        ("deepspeech2", "paper", 86.6e6),
        ("swav", "rn50-w2", 94e6 + 8.7e6),  # SwAV repo's trunk count + our 2048-2048-128 head, 3000 protos
    ],
)
def test_reference_parameter_counts(workload: str, preset: str, reference: float) -> None:
    assert get_workload(workload).param_count(preset) == pytest.approx(reference, rel=0.02)


def test_swav_trunk_is_torchvision_resnet50() -> None:
    import torchvision

    with torch.device("meta"):
        ours = sum(p.numel() for p in WideResNet50Trunk(64).parameters())
        tv = torchvision.models.resnet50()
    fc = sum(p.numel() for p in tv.fc.parameters())
    assert ours + fc == sum(p.numel() for p in tv.parameters()) == 25_557_032


@pytest.mark.parametrize("name", WORKLOADS)
def test_ladder_grows_and_meta_count_matches_built_model(name: str) -> None:
    w = get_workload(name)
    counts = [w.param_count(p) for p in w.ladder]
    assert w.ladder[0] == "tiny" and counts == sorted(counts) and len(set(counts)) == len(counts)
    torch.manual_seed(0)
    assert w.param_count("tiny") == sum(p.numel() for p in w.build("tiny").parameters())


@pytest.mark.parametrize("name", WORKLOADS)
def test_tiny_batches_are_deterministic_and_differ_per_rank(name: str) -> None:
    w = get_workload(name)
    a, b, c = (w.batch("tiny", 2, seed=0, step=3, rank=r) for r in (0, 0, 1))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].shape == c[k].shape)


@pytest.mark.parametrize("name", WORKLOADS)
def test_tiny_loss_falls_on_a_fixed_batch(name: str) -> None:
    w = get_workload(name)
    torch.manual_seed(0)
    model = w.build("tiny", dropout=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = w.batch("tiny", 8, seed=0, step=0, rank=0)
    losses = []
    for _ in range(20):
        opt.zero_grad(set_to_none=True)
        loss = w.loss(model, batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.9 * losses[0], losses


@pytest.mark.parametrize("strategy", ["ddp", "zero2"])
@pytest.mark.parametrize("name", WORKLOADS)
def test_tiny_runs_under_strategy_at_world_size_2(name: str, strategy: str, tiny_cell) -> None:
    """On the session's shared gloo world of 2 (tests/cells.py): the worker's rank code, the
    launcher's record."""
    record = run_cell_here(
        tiny_cell(
            workload=name, strategy=strategy, world_size=2, batch_size=4, steps=2, warmup=1, timeout_s=120
        )
    )
    assert record.status == "ok", record.error
    assert record.world_size == 2 and record.peak_mem_bytes["max"] > 0


@pytest.mark.parametrize(
    ("name", "preset"),
    [("transformer", p) for p in ("tiny", "small", "base", "h1024-l18", "1b")]
    + [("imagegpt", p) for p in ("tiny", "igpt-s", "igpt-l")],
)
def test_count_formula_equals_a_meta_build(name: str, preset: str) -> None:
    """transformer and imagegpt count parameters from the preset's shape (no library import, no
    build); a build on the meta device (models.base.Workload's general way) must agree."""
    from models.base import Workload

    w = get_workload(name)
    assert w.param_count(preset) == Workload.param_count(w, preset)
