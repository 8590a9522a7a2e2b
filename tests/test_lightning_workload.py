"""``--workload lightning:...`` (``models/lightning.py``): a LightningModule measured by
``shardbench run`` under ddp, zero2, zero3 and FSDP2 and planned by ``shardbench plan``, batches as
its dataloader or its example input makes them, and each bad spec one line and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shardbench.cli import main
from shardbench.harness import runner
from shardbench.models.registry import get_workload
from shardbench.records import read_records
from tests.cells import run_cell_here
from tests.extras import LIGHTNING

pytestmark = LIGHTNING

ROOT = Path(__file__).resolve().parents[1]
#: the example GPT at a tiny shape, named by its file as a user would (relative to the checkout)
GPT = ["--workload", "lightning:examples/lightning_gpt.py:GPTLit"]
TINY = ["--model-config", "vocab=64,width=32,depth=2,heads=2,seq=16,samples=32"]


@pytest.fixture
def here(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cells run on the session's world (the launcher has its own tests), from the checkout."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(runner, "run_cell", lambda cell, *, run_id: run_cell_here(cell, run_id=run_id))


def _typed(record) -> None:
    """The peak split by kind, and the model states between steps typed too."""
    breakdown, states = record.mem_breakdown_bytes, record.model_state_bytes
    assert all(breakdown[k] > 0 for k in ("params", "optimizer", "activations")), breakdown
    assert all(states[k] > 0 for k in ("params", "grads", "optimizer")), states
    per_rank = record.peak_mem_bytes["per_rank"]
    assert sum(breakdown.values()) == record.peak_mem_bytes["tracked_per_rank"][per_rank.index(max(per_rank))]


def test_run_measures_a_lightning_module_under_every_strategy(tmp_path: Path, here: None) -> None:
    out = tmp_path / "run"
    strategies = ["ddp", "zero2", "zero3", "fsdp2-zero2", "fsdp2-zero3"]
    argv = ["run", *GPT, *TINY, "--strategy", ",".join(strategies), "--world-size", "2", "--batch-size", "2"]
    assert main([*argv, "--steps", "2", "--warmup", "1", "--out", str(out)]) == 0
    records = {r.strategy: r for r in read_records([out])}
    assert set(records) == set(strategies)
    for r in records.values():
        assert r.status == "ok", r.error
        assert r.workload == "lightning:examples/lightning_gpt.py:GPTLit" and r.world_size == 2
        assert torch.isfinite(torch.tensor(r.loss["last"]))
        _typed(r)
    # ZeRO-2 shards the gradients and the optimizer state, ZeRO-3 the parameters too
    ddp, zero2, zero3 = (records[s].model_state_bytes for s in ("ddp", "zero2", "zero3"))
    assert zero2["optimizer"] < ddp["optimizer"] and zero2["grads"] < ddp["grads"]
    assert zero3["params"] < zero2["params"]


def test_plan_takes_a_lightning_module(tmp_path: Path, here: None) -> None:
    out = tmp_path / "plan"
    argv = ["plan", *GPT, *TINY, "--world-size", "4", "--budget", "1GiB", "--strategy", "ddp,zero2,zero3"]
    assert main([*argv, "--batch-size", "2", "--out", str(out)]) == 0
    records = read_records([out])
    assert sorted(r.strategy for r in records) == ["ddp", "zero2", "zero3"]
    for r in records:
        assert r.status == "ok", r.error
        _typed(r)


def test_batches_come_from_the_dataloader_or_the_example_input() -> None:
    loader = get_workload("lightning:tests.lightning_models:TinyLit")
    one, again = (loader.batch("default", 3, seed=0, step=2, rank=1) for _ in range(2))
    other = loader.batch("default", 3, seed=0, step=2, rank=0)
    assert list(one) == ["batch.0", "batch.1"] and one["batch.0"].shape == (3, 6)
    assert all(torch.equal(one[k], again[k]) for k in one) and not torch.equal(
        one["batch.0"], other["batch.0"]
    )
    model = loader.build("default")
    assert loader.loss(model, one).dim() == 0

    example = get_workload("lightning:tests.lightning_models:ExampleOnlyLit")
    batch = example.batch("default", 5, seed=0, step=0, rank=0)
    assert [t.shape for t in batch.values()] == [(5, 8)]
    model = example.build("default")
    assert example.loss(model, batch).dim() == 0
    assert isinstance(example.optimizer_factory()(model), torch.optim.SGD)


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("lightning:tests.lightning_models:in_rank", "not a LightningModule subclass"),
        ("lightning:tests.lightning_models:Missing", "has no attribute 'Missing'"),
        ("lightning:no_such_module:Lit", "no module 'no_such_module'"),
        ("lightning:TinyLit", "is not a built-in name"),
        (
            "lightning:tests.lightning_models:NoDataLit",
            "defines neither train_dataloader() nor example_input_array",
        ),
        ("lightning:tests.lightning_models:TwoOptimizersLit", "configure_optimizers returned 2 optimizers"),
    ],
)
def test_bad_specs_exit_2_in_one_line(spec: str, needle: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert main(["run", "--workload", spec, "--strategy", "ddp", "--world-size", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_without_lightning_one_line_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    import shardbench.models.lightning as adapter
    from shardbench.models import specs

    monkeypatch.setattr(adapter, "pl", None)
    specs.resolve.cache_clear()
    argv = ["run", "--workload", "lightning:tests.lightning_models:TinyLit", "--strategy", "ddp"]
    assert main([*argv, "--world-size", "1", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "the 'lightning' extra" in err and len(err.splitlines()) == 1, err
    specs.resolve.cache_clear()
