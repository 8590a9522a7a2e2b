"""Your own model's sizes (``models/presets/config_string.py``): a factory's keyword arguments
are presets, an ``hf:`` config or a ``ModelSpec(depth=...)`` gives a depth family whose counts
equal the models built, ``max-size --vary params`` searches it, and ``claim --workload`` takes
your own model at ``--model-config``'s shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardbench.cli import main
from shardbench.models.presets.config_string import depth_family
from shardbench.models.registry import get_workload
from shardbench.records import read_records
from shardbench.studies import maxsize
from tests.cells import run_cell_here
from tests.test_workload_specs import HF_TINY

SIZED = "tests.user_models:sized_net"


@pytest.mark.parametrize(("spec", "preset"), HF_TINY[:2], ids=["gpt2", "llama"])
def test_hf_depth_family_counts_the_models_it_names(spec: str, preset: str) -> None:
    workload = get_workload(spec)
    family = workload.size_family(preset)
    knob = next(iter(family.knobs))
    assert knob in preset  # the field the user wrote (GPT-2's n_layer), not a second alias
    for params, name in (family.members[0], family.members[4], family.members[30]):
        assert workload.param_count(name) == params, name
    base = dict(item.split("=") for item in preset.split(":"))
    assert family.parse(preset) == {knob: int(base[knob])}  # the user's own shape is on the axis


def test_factory_keywords_are_presets_and_depth_a_family() -> None:
    workload = get_workload(SIZED)
    assert "width=32:depth=3" in workload.presets and "widht=3" not in workload.presets
    model = workload.build("width=32:depth=3")
    assert len(model.blocks) == 3 and model.inp.out_features == 32
    assert workload.same_shape("width=32:depth=3", "depth=3:width=32")
    family = workload.size_family("width=32")
    assert [name for _, name in family.members[:2]] == ["width=32:depth=1", "width=32:depth=2"]
    assert workload.param_count("width=32:depth=7") == dict(map(reversed, family.members))["width=32:depth=7"]
    assert get_workload("tests.user_models:tiny_net").size_family() is None  # no depth named


def test_a_count_not_affine_in_depth_is_refused() -> None:
    with pytest.raises(ValueError, match="not affine in 'depth'"):
        depth_family("depth=2", "depth", lambda name: int(name.split("=")[1]) ** 2)


def test_max_size_searches_your_own_models_depth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Width 128 (about 16.5k parameters, 264 KiB of model states per block under ddp): the
    search ends on neighbouring depths, the largest within the budget, the next above it."""
    monkeypatch.setattr(maxsize, "run_cell", lambda cell, *, run_id: run_cell_here(cell, run_id=run_id))
    out = tmp_path / "ms"
    argv = ["max-size", "--workload", SIZED, "--model-config", "width=128", "--strategy", "ddp"]
    argv += ["--world-size", "4", "--fake", "--budget", "4MiB", "--batch-size", "2", "--out", str(out)]
    assert main([*argv, "--resolution", "0.01"]) == 0
    (summary,) = [r for r in read_records([out]) if r.max_size]
    fit, fail = summary.max_size["largest_fit"], summary.max_size["smallest_fail"]
    depth = lambda p: int(p["preset"].split("depth=")[1])  # noqa: E731
    assert depth(fail) == depth(fit) + 1
    assert fit["peak_bytes"] <= 4 << 20 < fail["peak_bytes"]


def test_claim_takes_your_own_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Resolution only (the claim's pipeline has its own tests): your workload replaces the
    spec's, at its --model-config shape and --batch-size, searched over its depth family, into a
    directory of its own."""
    from shardbench.report import claim_report
    from shardbench.studies import claim as claim_study

    seen = {}

    def fake_claim(spec, *, out_dir, workloads, resume, job_cells=None):
        seen.update(spec=spec, out=out_dir, workloads=workloads)
        out_dir.mkdir(parents=True, exist_ok=True)
        return claim_study.ClaimRun(results=[], wall_s=0.0, resumed=False)

    def fake_report(spec, results, out_dir, wall_s, *, resumed=False):
        (out_dir / "report.md").write_text("ok")
        return out_dir / "report.md"

    monkeypatch.setattr(claim_study, "claim", fake_claim)
    monkeypatch.setattr(claim_report, "write_claim_report", fake_report)
    monkeypatch.chdir(tmp_path)
    argv = ["claim", "--spec", "tiny", "--workload", f"transformer,{SIZED}", "--model-config", "width=8"]
    assert main([*argv, "--batch-size", "3"]) == 0
    names = [(w.name, w.preset, w.batch_size, w.ladder) for w in seen["spec"].workloads]
    assert names == [("transformer", "tiny", 2, ("tiny",)), (SIZED, "width=8", 3, None)]
    assert seen["out"] == Path("results/claim/tiny-tests-user-models-sized-net") and seen["workloads"] is None
    assert main(["claim", "--spec", "tiny", "--workload", "nope"]) == 2
    assert main(["claim", "--spec", "tiny", "--model-config", "width=8"]) == 2  # for no workload of yours
