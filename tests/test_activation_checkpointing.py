"""Activation checkpointing (models/checkpointing.py): the checkpointed model computes exactly
what the plain one does (loss, gradients, BatchNorm statistics, dropout masks), keeps less
activation memory, and runs under every strategy and under ``--fake``."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from shardbench.models.checkpointing import apply_activation_checkpointing, is_checkpointed
from shardbench.models.registry import get_workload, workload_names
from tests.cells import run_cell_here

WORKLOADS = workload_names()


def _step(workload, model: nn.Module, inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(1)  # the same dropout masks for both models' forward
    loss = workload.loss(model, inputs)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", WORKLOADS)
def test_checkpointed_model_computes_what_the_plain_one_does(name: str) -> None:
    """Same weights, same batch, dropout on: equal loss and gradients, and BatchNorm buffers
    (swav, deepspeech2) as after one forward, not two. Names are unchanged (no wrapper)."""
    workload = get_workload(name)
    torch.manual_seed(0)
    plain = workload.build("tiny")
    ac = copy.deepcopy(plain)
    units = workload.checkpoint_units(ac)
    apply_activation_checkpointing(ac, units)
    assert units and all(is_checkpointed(u) for u in units)
    assert list(ac.state_dict()) == list(plain.state_dict())
    inputs = workload.batch("tiny", 2, seed=0, step=0, rank=0)

    loss, grads = _step(workload, plain, inputs)
    ac_loss, ac_grads = _step(workload, ac, inputs)
    torch.testing.assert_close(ac_loss, loss, rtol=1e-6, atol=1e-6)
    for n, g in grads.items():
        torch.testing.assert_close(ac_grads[n], g, rtol=1e-5, atol=1e-6, msg=n)
    buffers = dict(plain.named_buffers())
    for n, b in ac.named_buffers():
        assert torch.equal(b, buffers[n]), n


def test_dropout_is_active_so_the_parity_above_checks_the_recompute_rng() -> None:
    """The transformer's blocks draw dropout masks (p > 0): a recompute that drew new ones
    would give other gradients than the plain model's."""
    workload = get_workload("transformer")
    model = workload.build("tiny")
    (block, *_) = workload.checkpoint_units(model)
    assert any(isinstance(m, nn.Dropout) and m.p > 0 for m in block.modules())


def test_batchnorm_counts_each_batch_once() -> None:
    unit = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    model = nn.Sequential(unit, nn.Linear(4, 1))
    apply_activation_checkpointing(model, [unit])
    model(torch.randn(8, 4, requires_grad=True)).sum().backward()
    assert int(unit[1].num_batches_tracked) == 1


def test_units_must_be_submodules_and_must_not_nest() -> None:
    inner = nn.Linear(2, 2)
    outer = nn.Sequential(inner)
    model = nn.Sequential(outer)
    with pytest.raises(ValueError, match="no units"):
        apply_activation_checkpointing(model, [])
    with pytest.raises(ValueError, match="not a submodule"):
        apply_activation_checkpointing(model, [nn.Linear(2, 2)])
    with pytest.raises(ValueError, match="must not nest"):
        apply_activation_checkpointing(model, [outer, inner])


@pytest.mark.parametrize("name", WORKLOADS)
def test_tracked_activations_shrink(name: str, tiny_cell) -> None:
    """One simulated cell with and without AC, in this process: the activations of the peak
    rank at its peak are fewer, the first loss the same."""
    plain_cell = tiny_cell(workload=name, world_size=2, simulate=True, steps=1, warmup=0)
    plain = run_cell_here(plain_cell)
    ac = run_cell_here(replace(plain_cell, activation_checkpointing=True))
    assert plain.status == ac.status == "ok", (plain.error, ac.error)
    assert ac.activation_checkpointing and not plain.activation_checkpointing
    assert ac.mem_breakdown_bytes["activations"] < plain.mem_breakdown_bytes["activations"]
    assert ac.loss["first"] == pytest.approx(plain.loss["first"], rel=1e-6)
    # the recompute is hardware FLOPs only; the model's math is the plain step's
    flops, ac_flops = plain.flops_per_step, ac.flops_per_step
    assert ac_flops.model == flops.model == flops.hardware < ac_flops.hardware
    for r in (plain, ac):  # a simulated cell's step time is its compute: its MFU is the compute's
        assert r.peak_flops_per_s["kind"] == "measured" and r.samples_per_s is None
        assert r.mfu == pytest.approx(
            r.flops_per_step.model / r.step_time_s["median"] / r.peak_flops_per_s["flops_per_s"]
        )
    assert ac.hfu / ac.mfu == pytest.approx(ac_flops.hardware / ac_flops.model)


STRATEGIES = ["dp", "ddp", "zero1", "zero2", "zero3", "torch-zero1", "fsdp2-zero2", "fsdp2-zero3"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_trains_with_checkpointing(strategy: str, tiny_cell) -> None:
    """World size 2 simulated (``dp`` cannot be: on the CPU it is the single-device reference)."""
    cell = tiny_cell(strategy=strategy, activation_checkpointing=True, steps=1, warmup=0)
    r = run_cell_here(cell if strategy == "dp" else replace(cell, simulate=True))
    assert r.status == "ok", r.error
    assert r.activation_checkpointing and r.mem_breakdown_bytes["activations"] > 0


@pytest.mark.parametrize("strategy", ["zero2", "zero3", "fsdp2-zero2"])
def test_fake_planning_with_checkpointing_equals_the_real_run(strategy: str, tiny_cell) -> None:
    """The recompute is planned too: the fake peak is the real one. (Per category only for
    ours: at this size FSDP2's fake and real runs split the same peak differently between
    parameters and activations, with or without checkpointing.)"""
    base = tiny_cell(strategy=strategy, simulate=True, activation_checkpointing=True, steps=1, warmup=0)
    real = run_cell_here(base)
    fake = run_cell_here(replace(base, fake=True))
    assert real.status == fake.status == "ok", (real.error, fake.error)
    assert fake.fake and fake.activation_checkpointing
    assert fake.peak_mem_bytes["max"] == pytest.approx(real.peak_mem_bytes["max"], rel=0.01)
    # FLOPs are counted in the planned cell too; it has no step time, so no MFU
    assert (fake.flops_per_step.model, fake.flops_per_step.hardware) == (
        real.flops_per_step.model,
        real.flops_per_step.hardware,
    )
    assert fake.mfu is None and real.mfu is not None
    if strategy != "fsdp2-zero2":
        assert fake.mem_breakdown_bytes == pytest.approx(real.mem_breakdown_bytes, rel=0.01, abs=64)


class CountsAttention(TorchFunctionMode):
    """Counts the scaled dot-product attention calls it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += func is torch.nn.functional.scaled_dot_product_attention
        return func(*args, **(kwargs or {}))


class Attends(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = k = v = x.view(2, 2, 8, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)


def test_the_recompute_runs_under_the_forwards_function_modes() -> None:
    """``Tensor.backward`` is a torch function, and a mode is off its stack while it handles
    one, so without the forward's modes put back the recompute would run under none: a mode
    that picks another attention kernel (a CUDA plan's) then saves other tensors than the
    forward did, and checkpointing refuses the step."""
    model = nn.Sequential(Attends())
    apply_activation_checkpointing(model, [model[0]])
    with CountsAttention() as mode:
        model(torch.randn(2, 64, requires_grad=True)).sum().backward()
    assert mode.calls == 2  # the forward's call and the recompute's

    from torch._subclasses.fake_tensor import FakeTensorMode

    from shardbench.metrics.kernels import CudaAttention, KernelWatch

    for dtype, kernel in ((torch.bfloat16, "flash"), (torch.float32, "memory-efficient")):
        watch = KernelWatch()
        with FakeTensorMode(), CudaAttention(), watch:
            x = torch.randn(2, 64, dtype=dtype, requires_grad=True)
            model(x).sum().backward()  # CheckpointError if the recompute ran another kernel
        assert watch.summary()["attention"] == kernel


#: a two-layer Llama with grouped-query attention, as ``--model-config`` and ``--seq-len`` write it
LLAMA_TOY = (
    "hidden_size=64:intermediate_size=128:num_hidden_layers=2:num_attention_heads=4:"
    "num_key_value_heads=2:vocab_size=256:seq_len=32"
)
#: each simulatable strategy with one of the workloads at one precision, every pair of them
#: covered (all 32 cells take about half a minute on two cores; the recompute is the same for
#: every strategy, only where its parameters come from differs): BERT passes a padding mask, so
#: CUDA runs memory-efficient attention at both precisions, Llama is causal, so flash at bf16
PLANNED = [
    ("ddp", "transformer", "bf16"),
    ("zero1", "hf:LlamaForCausalLM", "fp32"),
    ("torch-zero1", "transformer", "fp32"),
    ("zero2", "hf:LlamaForCausalLM", "bf16"),
    ("fsdp2-zero2", "transformer", "bf16"),
    ("zero3", "hf:LlamaForCausalLM", "fp32"),
    ("fsdp2-zero3", "hf:LlamaForCausalLM", "bf16"),
    ("fsdp2-hsdp", "transformer", "fp32"),
]


def test_the_planned_pairs_cover_every_simulatable_strategy() -> None:
    from shardbench.strategies.catalog import CARDS

    assert sorted(s for s, *_ in PLANNED) == sorted(card.name for card in CARDS if card.simulatable)
    assert {(w, p) for _, w, p in PLANNED} == {
        (w, p) for w in ("transformer", "hf:LlamaForCausalLM") for p in ("bf16", "fp32")
    }


@pytest.mark.parametrize(("strategy", "workload", "precision"), PLANNED)
def test_a_cuda_plan_with_checkpointing_plans_models_with_attention(
    strategy: str, workload: str, precision: str
) -> None:
    """``plan --device cuda --activation-checkpointing``'s cell, as the plan makes it, is ok;
    one step (no warm-up) holds a recompute."""
    from shardbench.studies.plan import planning_cells

    (cell,) = planning_cells(
        strategies=[strategy],
        workload=workload,
        preset="tiny" if workload == "transformer" else LLAMA_TOY,
        world_size=8,
        batch_size=2,
        precision=precision,
        activation_checkpointing=True,
        device="cuda",
        fake=True,
    )
    record = run_cell_here(replace(cell, warmup=0))
    assert record.status == "ok", record.error
    expected = "flash" if workload != "transformer" and precision == "bf16" else "memory-efficient"
    assert record.strategy_settings["kernels"]["attention"] == expected
