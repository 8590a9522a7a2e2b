"""A CUDA-targeted plan made on the CPU books what the CPU plan books, but for the two kernels
that differ between the targets, each within what that kernel can change.

``plan --device cuda`` on a machine without CUDA runs the same simulated rank under
FakeTensorMode with two kernels swapped for CUDA's (``bench/metrics/kernels.py``): the
optimizer's ``foreach`` implementation for the per-parameter loop, and a fused attention kernel
for the CPU's math path. Nothing else changes, so at the peak:

- parameters, gradients, comm and other are equal to the byte (which also says both peaks fall
  at the same moment of the step, so the two categories below are compared like for like);
- optimizer bytes differ by at most the foreach temporaries: AdamW's foreach step holds one
  list shaped like its second moments (``sqrt(exp_avg_sq)``, then divided and shifted in
  place) over the parameters this rank steps, half of the optimizer state the rank keeps (two
  moments per element, plus the step counters);
- activations differ by at most what the math path keeps for backward beyond a fused kernel:
  the masked scores, their softmax, the dropout mask and the dropped probabilities, four fp32
  ``(batch, heads, seq, seq)`` tensors per attention call, where the fused kernels keep a
  log-sum-exp per query.

FSDP2's parameters are DTensors, and under a fake plan DTensor's shape propagation used to be
counted as the rank's memory: the foreach step booked global-shaped copies of every parameter
(``bench/metrics/shape_propagation.py``).
"""

from __future__ import annotations

import pytest

from shardbench.models.presets.transformer import NAMED
from shardbench.strategies.catalog import CARDS
from tests.cells import run_cell_here, tiny_cell

SIMULATABLE = [card.name for card in CARDS if card.simulatable]
#: per-rank batch: the activations (2.3 MiB at the peak) exceed ddp's foreach temporaries
#: (2.1 MiB), so every strategy's peak stays in backward on both targets
BATCH = 3
TINY = NAMED["tiny"]


def _plan(strategy: str, device: str):
    cell = tiny_cell(
        strategy=strategy, world_size=8, simulate=True, fake=True, device=device, batch_size=BATCH,
        steps=1,
    )  # fmt: skip
    record = run_cell_here(cell)
    assert record.status == "ok", record.error
    return record


def _attention_bound() -> int:
    layers, heads, seq = TINY["num_hidden_layers"], TINY["num_attention_heads"], TINY["seq_len"]
    return layers * 4 * 4 * BATCH * heads * seq * seq


@pytest.mark.parametrize("strategy", SIMULATABLE)
def test_a_cuda_plan_differs_from_the_cpu_plan_only_by_its_kernels(strategy: str) -> None:
    cpu, cuda = _plan(strategy, "cpu"), _plan(strategy, "cuda")
    assert cpu.strategy_settings["kernels"]["optimizer"] == "for-loop"
    assert cuda.strategy_settings["kernels"]["optimizer"] == "foreach"
    on_cpu, on_cuda = cpu.mem_breakdown_bytes, cuda.mem_breakdown_bytes
    for category in ("params", "grads", "comm", "other"):
        assert on_cuda[category] == on_cpu[category], (category, on_cpu, on_cuda)
    foreach_temporaries = cpu.model_state_bytes["optimizer"] // 2
    assert abs(on_cuda["optimizer"] - on_cpu["optimizer"]) <= foreach_temporaries, (on_cpu, on_cuda)
    assert abs(on_cuda["activations"] - on_cpu["activations"]) <= _attention_bound(), (on_cpu, on_cuda)
    assert on_cuda["activations"] > _attention_bound()  # the peak is in backward, as the batch was chosen


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "for-loop"])
def test_a_fake_step_over_dtensor_parameters_books_what_real_tensors_hold(foreach: bool) -> None:
    """One FSDP2 step tracked on real tensors and again under FakeTensorMode: the same peak and
    breakdown to the byte, whichever optimizer implementation steps the shards."""
    import contextlib

    import torch
    from torch import nn
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from tests.dist import fake_world
    from tests.tracked_steps import tracked_peak

    def peak(mesh: object, fake: bool) -> tuple[int, dict[str, int]]:
        with FakeTensorMode() if fake else contextlib.nullcontext():
            model = nn.Sequential(*[nn.Linear(64, 64, bias=False) for _ in range(3)])
            for layer in model:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=foreach)
            inputs = [torch.randn(4, 64) for _ in range(2)]
            model(inputs[0]).sum().backward()
            opt.step()  # optimizer state exists before tracking, as after the harness's first step

            def step(x: torch.Tensor) -> None:
                opt.zero_grad(set_to_none=True)
                model(x).sum().backward()
                opt.step()

            return tracked_peak([model, opt], inputs, step)

    with fake_world(8):
        mesh = init_device_mesh("cpu", (8,))
        real, fake = peak(mesh, False), peak(mesh, True)
    assert fake == real
