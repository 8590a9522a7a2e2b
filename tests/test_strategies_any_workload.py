"""Every strategy that can run as a simulated rank measures any kind of workload, not only the
built-in ones: the example LightningModule (whose ``training_step`` runs inside the strategy's
forward and calls ``self(...)`` again) and a Hugging Face architecture built from its config,
at N = 2 and N = 8, each rank's memory typed by category.

Ranks are simulated in this process (one rank of a fake world, real tensors), which is what
``plan`` and ``max-size`` run and costs a fraction of a second a cell; real ranks of the same
LightningModule are measured by ``test_lightning_workload.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardbench.strategies.catalog import CARDS
from tests.cells import run_cell_here, tiny_cell
from tests.extras import LIGHTNING, TRANSFORMERS

pytestmark = [LIGHTNING, TRANSFORMERS]

ROOT = Path(__file__).resolve().parents[1]
SIMULATABLE = [card.name for card in CARDS if card.simulatable]
#: (workload, preset): the smallest shapes, one block each (FSDP2 and zero3 shard it apart from the root)
WORKLOADS = [
    ("lightning:examples/lightning_gpt.py:GPTLit", "vocab=64:width=16:depth=1:heads=2:seq=8:samples=16"),
    ("hf:GPT2LMHeadModel", "n_embd=16:n_layer=1:n_head=2:vocab_size=64:n_positions=16:seq_len=8"),
]


@pytest.mark.parametrize("world_size", [2, 8])
@pytest.mark.parametrize("workload, preset", WORKLOADS, ids=[w.split(":")[0] for w, _ in WORKLOADS])
@pytest.mark.parametrize("strategy", SIMULATABLE)
def test_every_simulatable_strategy_measures_the_workload(
    strategy: str, workload: str, preset: str, world_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the example is named by its path in the checkout, as the docs do
    cell = tiny_cell(
        workload=workload,
        preset=preset,
        strategy=strategy,
        world_size=world_size,
        simulate=True,
        steps=1,
        warmup=0,
    )
    record = run_cell_here(cell)
    assert record.status == "ok", record.error
    breakdown = record.mem_breakdown_bytes
    assert all(breakdown[k] > 0 for k in ("params", "optimizer", "activations")), breakdown
    assert sum(breakdown.values()) == record.peak_mem_bytes["max"]
    # (ddp's gradients are views of its buckets between steps, held as comm: not asserted)
    states = record.model_state_bytes
    assert states["params"] > 0 and states["optimizer"] > 0, states
