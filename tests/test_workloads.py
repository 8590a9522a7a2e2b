"""The four workloads: reference parameter counts (meta device), ladders and tiny presets that
learn. Their runs under ddp and zero2 at world size 2 are the smoke suite's, checked cell by cell
in tests/test_run_end_to_end.py."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shardbench.models import registry
from shardbench.models.registry import get_workload, workload_names
from shardbench.models.swav import WideResNet50Trunk

WORKLOADS = ["transformer", "imagegpt", "swav", "deepspeech2"]
REPO = Path(__file__).resolve().parents[1]


def _presets(name: str) -> list[str]:
    return list(importlib.import_module(f"shardbench.models.presets.{name}").PRESETS)


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


@pytest.mark.parametrize(
    ("name", "preset"), [(name, preset) for name in WORKLOADS for preset in _presets(name)]
)
def test_count_formula_equals_a_meta_build(name: str, preset: str) -> None:
    """Every workload counts parameters from the preset's shape (models/presets/: no library
    import, no build); a build on the meta device (shardbench.models.base.Workload's general way) must agree
    exactly, for every preset."""
    from shardbench.models.base import Workload

    w = get_workload(name)
    assert w.param_count(preset) == Workload.param_count(w, preset)


def test_preset_param_counts_import_no_torch() -> None:
    """``shardbench list`` counts every preset of every workload through the registry without
    importing torch or a model library (each takes seconds)."""
    code = (
        "import sys, shardbench.models.registry as r\n"
        "counts = {n: r.preset_param_counts(n) for n in r.workload_names()}\n"
        "assert all(c and all(v > 0 for v in c.values()) for c in counts.values()), counts\n"
        "print(sorted(m for m in ('torch', 'transformers', 'torchvision', 'torchaudio') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_preset_param_counts_agree_with_the_workloads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Preset order and counts of the workload classes; a workload without a presets module falls
    back to its class's count (a meta build); an unknown name is the registry's ValueError."""
    for name in WORKLOADS:
        w = get_workload(name)
        counts = registry.preset_param_counts(name)
        assert list(counts.items()) == [(p, w.param_count(p)) for p in w.presets]
    monkeypatch.setitem(registry._WORKLOADS, "test-mlp", "tests.tiny_models:MLPWorkload")
    embed, fc1, fc2, head = 512 * 32, 32 * 128 + 128, 128 * 32 + 32, 32 * 8 + 8  # tests/tiny_models.py
    counts = registry.preset_param_counts("test-mlp")
    assert list(counts) == list(get_workload("tests.tiny_models:MLPWorkload").presets)
    assert counts["tiny"] == embed + fc1 + fc2 + head
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        registry.preset_param_counts("nope")


def test_deepspeech2_freq_bins_match_the_spectrogram_window() -> None:
    from shardbench.models import deepspeech2

    assert deepspeech2.FREQ_BINS == deepspeech2.WINDOW // 2 + 1
