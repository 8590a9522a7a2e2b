"""fp16 training through every strategy that runs it on the CPU: each trains to the
single-process fp16 reference (autocast to fp16 with ``torch.amp.GradScaler``), keeps the model
states of the ZeRO formula (the same bytes as bf16: 16-bit parameters and gradients over fp32
masters for ours, autocast over fp32 parameters for the DDP family), and a peer whose fp16 loss
scaler needs CUDA is refused on the CPU in one line."""

from __future__ import annotations

import pytest
import torch

from shardbench.harness.validate import plan_cells
from shardbench.strategies.registry import check_runnable, cpu_has_fp16_kernels
from tests.cells import run_cell_here, tiny_cell
from tests.dist import run_in_world
from tests.parity import max_rel_diff, train_reference, train_strategy_rank

STEPS, BATCH = 4, 4
#: fp16 keeps 11 significant bits; ours rounds its parameters to fp16 after each step and FSDP2
#: computes with fp16 copies of them, where the reference autocasts over fp32 parameters:
#: measured up to 9.7e-3 (per tensor, max-norm) after 4 steps at N=2. One step less is 1.39.
TOLERANCE = 2e-2


def _sgd(model):  # module-level: passed to spawned ranks; SGD so that every update is seen
    return torch.optim.SGD(model.parameters(), lr=0.5)


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    ref = train_reference("transformer", "tiny", 2, STEPS, BATCH, _sgd, precision="fp16")
    fewer = train_reference("transformer", "tiny", 2, STEPS - 1, BATCH, _sgd, precision="fp16")
    assert max_rel_diff(fewer, ref)[0] > 10 * TOLERANCE  # the comparison can fail
    return ref


@pytest.mark.parametrize(
    "strategy",
    ["ddp", "torch-zero1", "zero1", "zero2", "zero3", "fsdp2-zero2", "fsdp2-zero3", "deepspeed-zero2"],
)
def test_fp16_trains_to_the_single_process_fp16_reference(strategy: str, reference) -> None:
    if strategy.startswith("deepspeed"):  # the 'peers' extra; DeepSpeed's own fp16 section and scaler
        pytest.importorskip("deepspeed")
        if not cpu_has_fp16_kernels():  # refused in one line before anything runs
            with pytest.raises(ValueError, match="cannot train fp16 on this CPU"):
                check_runnable(strategy, "cpu", "fp16")
            return
    states = run_in_world(
        train_strategy_rank, 2, strategy, "transformer", "tiny", STEPS, BATCH, _sgd, False, "fp16"
    )
    for rank, state in enumerate(states):
        diff, where = max_rel_diff(state, reference)
        assert diff < TOLERANCE, f"{strategy} rank {rank}: {where} off by {diff:.2e}"


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero3", "fsdp2-zero2"])
def test_fp16_model_states_are_the_formula_and_bf16s_bytes(strategy: str) -> None:
    fp16 = run_cell_here(
        tiny_cell(strategy=strategy, world_size=8, simulate=True, steps=1, warmup=2, precision="fp16")
    )
    bf16 = run_cell_here(
        tiny_cell(strategy=strategy, world_size=8, simulate=True, steps=1, warmup=2, precision="bf16")
    )
    assert fp16.status == "ok", fp16.error
    measured, predicted = fp16.model_state_bytes, fp16.predicted_mem_bytes
    for key in ("params", "grads", "optimizer", "total"):
        # flat-bucket padding and AdamW's 4-byte step counters: far under 1% here
        assert measured[key] == pytest.approx(predicted[key], rel=0.01), key
    # the same bytes as bf16 (the loss scaler's own few bytes are held beside them, not states)
    states = ("params", "grads", "optimizer", "total")
    assert {k: measured[k] for k in states} == {k: bf16.model_state_bytes[k] for k in states}
    assert predicted == bf16.predicted_mem_bytes
    if strategy.startswith("zero"):  # ours keeps 16-bit parameters: 2 bytes each, not autocast's 4
        assert predicted["params"] < 4 * fp16.params / (8 if strategy == "zero3" else 1)


@pytest.mark.parametrize("strategy", ["fairscale-zero1", "fairscale-zero2"])
def test_a_peer_whose_fp16_scaler_needs_cuda_is_refused_on_the_cpu(strategy: str) -> None:
    pytest.importorskip("fairscale")
    with pytest.raises(ValueError) as refused:
        plan_cells([tiny_cell(strategy=strategy, world_size=2, precision="fp16")])
    line = str(refused.value)
    assert "\n" not in line and "only with --device cuda" in line and "ShardedGradScaler" in line
    assert "zero2" in line.split("fp16 on cpu:")[1]  # and names what does run it here
    plan_cells([tiny_cell(strategy=strategy, world_size=2, precision="bf16")])  # only fp16 is


def test_warm_up_lasts_until_the_loss_scaler_takes_a_step(monkeypatch) -> None:
    """A scale that overflows the first gradients skips those steps (no update, no optimizer
    state yet): warm-up goes on until the scaler steps, so the timed steps are steps and the
    tracked model states include the optimizer's. The record says what was skipped and added."""
    from shardbench.strategies.base import Strategy

    overflowing = lambda self, optimizer, ctx: torch.amp.GradScaler("cpu", init_scale=2.0**30)  # noqa: E731
    monkeypatch.setattr(Strategy, "loss_scaler", overflowing)
    record = run_cell_here(tiny_cell(strategy="dp", world_size=1, steps=2, warmup=1, precision="fp16"))
    assert record.status == "ok", record.error
    scaled = record.strategy_settings["loss_scale"]
    # the asked-for step and every added one but the last were skipped
    assert scaled["skipped_warmup"] == scaled["warmup_added"] > 1
    assert scaled["skipped_timed"] == scaled["skipped_tracked"] == 0
    assert scaled["scale"] == 2.0 ** (30 - scaled["skipped_warmup"])
    measured, predicted = record.model_state_bytes, record.predicted_mem_bytes
    # (AdamW's 4-byte step counters beside the formula's 12 bytes per parameter)
    assert (
        measured["optimizer"] == pytest.approx(predicted["optimizer"], rel=0.01)
        and predicted["optimizer"] > 0
    )


def test_fsdp2_keeps_batch_norm_in_fp32_under_its_mixed_precision() -> None:
    """A ResNet under FSDP2 at fp16: batch norm's parameters stay fp32 beside its fp32 running
    statistics (each norm a unit of its own, its output in fp16), so the step runs, and the
    model states are still the formula's."""
    record = run_cell_here(
        tiny_cell(
            workload="swav",
            strategy="fsdp2-zero3",
            world_size=8,
            simulate=True,
            steps=1,
            warmup=1,
            precision="fp16",
        )
    )
    assert record.status == "ok", record.error
    measured, predicted = record.model_state_bytes, record.predicted_mem_bytes
    assert measured["total"] == pytest.approx(predicted["total"], rel=0.01)
