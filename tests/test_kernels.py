"""A plan models the kernels its target device would run (``bench/metrics/kernels.py``): the
optimizer implementation torch picks there, whose temporaries the peak then includes, and the
attention kernel; and every record says which it assumed."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import shardbench.models.base
from shardbench.metrics.kernels import KernelWatch, default_implementation, pin_implementation
from tests.cells import run_cell_here, tiny_cell

#: an MLP whose optimizer step is its peak: ~270k parameters, activations of a few KiB at batch 1
SIZED = dict(workload="tests.user_models:sized_net", preset="width=256:depth=4")


def test_the_default_is_what_torch_picks_for_the_device() -> None:
    from torch.optim.optimizer import _default_to_fused_or_foreach

    _, foreach = _default_to_fused_or_foreach([torch.zeros(2)], differentiable=False, use_fused=False)
    assert default_implementation("cpu") == ("foreach" if foreach else "for-loop") == "for-loop"
    assert default_implementation("cuda") == "foreach"  # torch's documented default on CUDA

    params = [torch.nn.Parameter(torch.zeros(2))]
    chosen = torch.optim.AdamW(params, foreach=False)
    assert pin_implementation(chosen, "cuda").param_groups[0]["foreach"] is False  # the user's choice
    assert pin_implementation(torch.optim.AdamW(params), "cuda").param_groups[0]["foreach"] is True


def test_the_watch_sees_the_implementation_that_ran() -> None:
    for foreach, expected in ((True, "foreach"), (False, "for-loop")):
        p = torch.nn.Parameter(torch.ones(3))
        opt = torch.optim.AdamW([p], foreach=foreach)
        p.grad = torch.ones(3)
        watch = KernelWatch()
        with watch.watching_steps():
            opt.step()
        assert watch.summary()["optimizer"] == expected


@pytest.mark.parametrize("strategy", ["ddp", "zero2"])
def test_a_cuda_plan_counts_the_foreach_temporaries(strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planned for CUDA (on this CPU when it has no CUDA), the optimizer is AdamW's foreach path,
    as on a card; the peak holds its temporaries, exactly as a real run that takes that path
    (here on the CPU, made to) allocates them; planned for the CPU, the loop, without them."""
    cell = tiny_cell(**SIZED, strategy=strategy, world_size=2, batch_size=1, simulate=True, fake=True)
    cpu = run_cell_here(cell)
    cuda = run_cell_here(replace(cell, device="cuda"))
    assert cpu.status == cuda.status == "ok", (cpu.error, cuda.error)
    assert cpu.strategy_settings["kernels"]["optimizer"] == "for-loop"
    assert cuda.strategy_settings["kernels"]["optimizer"] == "foreach"

    def adamw_foreach(model: torch.nn.Module, *, lr: float) -> torch.optim.Optimizer:
        return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, foreach=True)

    monkeypatch.setattr(shardbench.models.base, "_adamw_over_trainable", adamw_foreach)
    real = run_cell_here(replace(cell, fake=False))
    assert real.status == "ok" and real.strategy_settings["kernels"]["optimizer"] == "foreach"
    assert cuda.peak_mem_bytes["max"] == pytest.approx(real.peak_mem_bytes["max"], rel=0.01)
    assert cuda.peak_mem_bytes["max"] >= cpu.peak_mem_bytes["max"]
    if strategy == "ddp":  # its peak is the step: model states and a temporary per parameter
        states = cuda.model_state_bytes
        stepped = states["optimizer"] / 2  # AdamW keeps two fp32 states per element stepped
        with_temporaries = states["params"] + states["grads"] + states["optimizer"] + stepped
        assert cpu.peak_mem_bytes["max"] < with_temporaries <= cuda.peak_mem_bytes["max"]


def test_a_cuda_plan_assumes_cudas_attention() -> None:
    """The tiny transformer trains with dropout, for which the CPU has no fused attention (the
    math path keeps the score matrix); CUDA runs memory-efficient attention, and so does its
    plan, with a smaller activation peak."""
    cell = tiny_cell(world_size=2, batch_size=4, simulate=True, fake=True)
    cpu = run_cell_here(cell)
    cuda = run_cell_here(replace(cell, device="cuda"))
    assert cuda.strategy_settings["kernels"]["attention"] == "memory-efficient"
    assert cpu.strategy_settings["kernels"]["attention"].startswith("none fused")
    assert cuda.mem_breakdown_bytes["activations"] < cpu.mem_breakdown_bytes["activations"]
    if not torch.cuda.is_available():
        assert cuda.strategy_settings["planned_for"] == "cuda, planned on the CPU"


@pytest.mark.parametrize(("dtype", "kernel"), [(torch.float32, "efficient"), (torch.bfloat16, "flash")])
def test_a_cuda_plan_routes_the_attention_inside_multihead_attention(dtype: torch.dtype, kernel: str) -> None:
    """nn.MultiheadAttention calls the attention from inside torch's own function: the plan
    routes that call to the kernel CUDA would run too, and leaves no routing behind."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from shardbench.metrics.kernels import CudaAttention

    ran: list[str] = []

    class Ops(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ran.append(func._opname)
            return func(*args, **(kwargs or {}))

    sdpa = torch.nn.functional.scaled_dot_product_attention
    with FakeTensorMode():
        attn = torch.nn.MultiheadAttention(64, num_heads=8, batch_first=True, dtype=dtype)
        x = torch.randn(2, 16, 64, dtype=dtype)
        with CudaAttention(), Ops():
            attn(x, x, x, need_weights=False)[0].sum().backward()
    assert any(kernel in op and "attention" in op for op in ran), ran
    assert not any(op.endswith("_for_cpu") for op in ran), ran
    assert torch.nn.functional.scaled_dot_product_attention is sdpa
