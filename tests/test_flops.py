"""FLOPs of a training step (``bench/prediction/flops.py``): the transformer's count against the
closed form 6·Ψ·tokens plus attention, activation checkpointing's recompute in the hardware
count only, the model left as it was, and the CPU's fused attention counted like CUDA's.
Counted under FakeTensorMode on the tiny presets: a fraction of a second each."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shardbench.models.checkpointing import apply_activation_checkpointing
from shardbench.models.registry import get_workload
from shardbench.prediction.flops import SCORE_RECOMPUTE, count_step_flops, matmul_dtype

CPU = torch.device("cpu")
BATCH = 2


def _transformer(checkpointed: bool = False) -> tuple[nn.Module, dict]:
    workload = get_workload("transformer")
    model = workload.build("tiny")
    if checkpointed:
        apply_activation_checkpointing(model, workload.checkpoint_units(model))
    return model, workload.presets["tiny"]


def _count(model: nn.Module, **kw):
    workload = get_workload("transformer")
    batch = lambda: workload.batch("tiny", BATCH, seed=0, step=0, rank=0)  # noqa: E731
    return count_step_flops(model, workload.loss, batch, device=CPU, **kw)


def test_transformer_count_is_the_closed_form_and_6_psi_tokens_says_how_far() -> None:
    """The count is exactly 6·Ψ·T + 12·L·s·d·T + 6·B·(d² + d·C) for Ψ the encoder's matmul
    weights (4d² + 2·d·f a layer), T = B·s tokens: a forward is 2 FLOPs per weight per token
    and attention's QKᵀ and AV 4·s·d per token a layer; backward is twice the forward (the
    gradient of each product's input and of its weight); the pooler and the classifier run once
    per sequence, not per token.

    With Ψ every parameter, as 6·Ψ·T is usually quoted, the closed form overcounts, by exactly
    what is no matmul per token: the embeddings (a lookup), LayerNorms and biases (elementwise:
    torch's formulas count only matrix products, convolutions and attention), and the pooler and
    head counted per token instead of per sequence. For the tiny preset that is 41% over the
    count (its 1024 x 128 embedding is a quarter of its 0.56M parameters, the attention term 4%
    of the count); for bert-base, whose count of 134,090,606,592 FLOPs at batch 2 this closed
    form also gives exactly, 28% over (its 30522-token embedding is a fifth of its 109M
    parameters; attention 2.7% of the count at s = 128)."""
    model, p = _transformer()
    flops = _count(model)
    d, f, n_layers, s, labels = (
        p[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "seq_len", "num_labels")
    )
    tokens = BATCH * s
    psi = n_layers * (4 * d * d + 2 * d * f)
    attention = 12 * n_layers * s * d * tokens
    per_sequence = 6 * BATCH * (d * d + d * labels)
    assert flops.model == flops.hardware == 6 * psi * tokens + attention + per_sequence

    every = sum(t.numel() for t in model.parameters())
    matmul_weights = psi + d * d + d * labels  # the encoder's, the pooler's and the head's
    not_matmul = every - matmul_weights  # embeddings, LayerNorms, biases
    quoted = 6 * every * tokens + attention
    assert quoted - flops.model == 6 * tokens * not_matmul + 6 * (tokens - BATCH) * (d * d + d * labels)
    assert quoted / flops.model == pytest.approx(1.41, abs=0.005)
    assert flops.by_op.keys() == {"aten.addmm", "aten.mm", "aten.bmm"}  # linears, their grads, attention


def test_checkpointing_raises_hardware_flops_by_one_forward_of_its_units() -> None:
    """Model FLOPs are the plain model's; hardware FLOPs add each checkpointed layer's forward,
    recomputed in backward: 2·T·(4d² + 2·d·f) + 4·B·s²·d a layer."""
    plain = _count(_transformer()[0])
    model, p = _transformer(checkpointed=True)
    ac = _count(model)
    d, f, n_layers, s = (p[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "seq_len"))
    layer_forward = 2 * BATCH * s * (4 * d * d + 2 * d * f) + 4 * BATCH * s * s * d
    assert ac.model == plain.model == plain.hardware
    assert ac.hardware - ac.model == n_layers * layer_forward


def _by_op(counted: dict) -> dict[str, int]:
    return {str(op): int(n) for op, n in counted.items() if n}


@pytest.mark.parametrize("case", ["inference-mode", "cond", "convolution", "products"])
def test_the_step_counter_counts_what_torchs_flop_counter_does(case: str) -> None:
    """Per operator, what ``FlopCounterMode`` counts (its global counts), with no module
    tracking: an operator that reaches the mode whole is counted by what it decomposes into
    (``nn.Linear`` under ``inference_mode``), ``torch.cond`` as its costlier branch."""
    from torch.utils.flop_counter import FlopCounterMode

    from shardbench.prediction.flops import StepFlopCounter

    torch.manual_seed(0)
    x = torch.randn(4, 8)
    if case == "inference-mode":
        layer = nn.Linear(8, 8)

        def run() -> None:
            with torch.inference_mode():
                layer(x)

    elif case == "cond":

        def run() -> None:
            def costly(t):
                return t @ torch.ones(8, 8) @ torch.ones(8, 8)

            def cheap(t):
                return t @ torch.ones(8, 8)

            torch.cond(x.sum() > 0, costly, cheap, (x,))

    elif case == "convolution":
        net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ConvTranspose2d(4, 2, 3))

        def run() -> None:
            net(torch.randn(2, 3, 8, 8)).sum().backward()

    else:
        w = torch.randn(2, 8, 8, requires_grad=True)

        def run() -> None:
            y = torch.einsum("bij,bjk->bik", w, w)
            torch.baddbmm(y, y, w).sum().backward()

    with StepFlopCounter({}) as ours:
        run()
    with FlopCounterMode(display=False) as torchs:
        run()
    assert _by_op(ours.by_op) == _by_op(torchs.get_flop_counts()["Global"])
    assert sum(ours.by_op.values()) > 0  # a case that counts nothing would prove nothing


def test_a_recompute_on_one_thread_is_not_another_threads() -> None:
    """A count books what runs during a recompute as the recompute; a recompute running on
    another thread at the time is not its own (on CUDA, backward and its recomputes run on the
    autograd engine's thread, where the counted calls are made too)."""
    import threading

    from shardbench.models.checkpointing import recomputing

    inside, release, seen = threading.Event(), threading.Event(), []

    class Waits(nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            if recomputing():
                seen.append(True)
                inside.set()
                release.wait(timeout=30)
            return t * t  # saves t for backward, so backward recomputes it

    model = nn.Sequential(Waits())
    apply_activation_checkpointing(model, [model[0]])
    worker = threading.Thread(target=lambda: model(torch.ones(2, requires_grad=True)).sum().backward())
    worker.start()
    try:
        assert inside.wait(timeout=30), "the recompute never ran"
        assert not recomputing()  # this thread is not recomputing, whatever the other one does
    finally:
        release.set()
        worker.join(timeout=30)
    assert seen == [True] and not recomputing()


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.5), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@pytest.mark.parametrize("tensors", ["fake", "real"])
def test_counting_leaves_the_model_and_the_rng_as_they_were(tensors: str) -> None:
    """No gradient on a parameter, the norm statistics unchanged, the RNG where it was: the
    measured steps that follow are the ones they would have been."""
    torch.manual_seed(0)
    model = _Net()
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    rng = torch.get_rng_state()
    flops = count_step_flops(
        model, lambda m, x: m(x).square().mean(), lambda: torch.randn(6, 8), device=CPU, tensors=tensors
    )
    assert flops.model == flops.hardware == 3 * 2 * 6 * (8 * 16 + 16 * 4) - 2 * 6 * 8 * 16
    assert flops.counted_on == ("real tensors" if tensors == "real" else "fake tensors")
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(b, buffers[n]) for n, b in model.named_buffers())
    assert torch.equal(torch.get_rng_state(), rng)


def test_fused_attention_counts_like_the_plain_products_and_its_recompute_as_hardware() -> None:
    """The CPU's flash kernel (what SDPA runs without a mask; torch counts only CUDA's) is
    counted with CUDA's formula: a forward F = 4·B·H·s²·dh, a backward 2F of model FLOPs (the
    gradients, as the plain bmm path counts them) and F/2 more of hardware FLOPs (the score
    matrix it recomputes)."""
    b, h, s, dh = 2, 2, 16, 8

    def loss(model: nn.Module, q: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, model.weight * q, q, is_causal=True).sum()

    flops = count_step_flops(nn.Linear(1, 1), loss, lambda: torch.randn(b, h, s, dh), device=CPU)
    forward = 4 * b * h * s * s * dh
    assert (flops.model, flops.hardware) == (3 * forward, 3 * forward + forward // 2)
    assert flops.by_op == {
        "aten._scaled_dot_product_flash_attention_for_cpu": forward,
        "aten._scaled_dot_product_flash_attention_for_cpu_backward": 2 * forward,
        SCORE_RECOMPUTE: forward // 2,
    }


def test_the_matmul_dtype_picks_the_peak() -> None:
    assert matmul_dtype("bf16", "cpu") == matmul_dtype("bf16", "cuda") == "bf16"
    assert matmul_dtype("fp32", "cpu") == "fp32"
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert matmul_dtype("fp32", "cuda") == "fp32"
        torch.backends.cuda.matmul.allow_tf32 = True
        assert matmul_dtype("fp32", "cuda") == "tf32"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_a_commands_cells_count_a_step_once(tiny_cell) -> None:
    """The launcher takes each count back from the cell's rank 0 and hands it to the next cell
    of the same step (another strategy) in the same run: that rank does not count again, and
    records the same."""
    from shardbench.harness import counting, launch
    from shardbench.harness.validate import plan_cells

    first, second = plan_cells(
        [tiny_cell(steps=1, warmup=0, seed=5), tiny_cell(steps=1, warmup=0, seed=5, strategy="zero2")]
    )
    a = launch.run_cell(first, run_id="count-once")
    kept = counting.StepCounts()
    kept.adopt(launch.counts_file("run count-once"))
    assert [k[:4] for k in kept.keys()] == [("transformer", "tiny", first.batch_size, 5)]
    b = launch.run_cell(second, run_id="count-once")
    counted, handed = a.flops_per_step, b.flops_per_step
    assert handed.count_s < counted.count_s / 10
    assert replace(handed, count_s=None) == replace(counted, count_s=None)
    assert a.compute_replay.calls == b.compute_replay.calls


def test_two_owners_never_share_their_counts() -> None:
    """Counts are held by their owner (a run's launcher, a rank process, a job's leader): what
    one counted is not another's, and two runs keep theirs apart."""
    from shardbench.harness import counting, launch
    from shardbench.prediction.flops import StepFlops

    one, other = counting.StepCounts(), counting.StepCounts()
    one.add(("k", 1), (StepFlops(model=2, hardware=3, by_op={"mm": 3}, counted_on="fake tensors"), None))
    assert one.keys() == [("k", 1)] and other.get(("k", 1)) is None and other.keys() == []
    assert launch.counts_file("run a") != launch.counts_file("run b")


def test_a_count_file_that_is_not_whole_hands_nothing(tmp_path) -> None:
    """A rank killed while writing its counts leaves a file cut short: the launcher takes
    nothing from it (the next cell counts again) and goes on."""
    from shardbench.harness import counting
    from shardbench.prediction.flops import StepFlops

    counts = counting.StepCounts()
    whole = tmp_path / "whole.json"
    counted = (StepFlops(model=2, hardware=3, by_op={"mm": 3}, counted_on="fake tensors"), None)
    counts.add(("k", 1), counted)
    counts.export(whole, own_only=False)
    (tmp_path / "cut.json").write_text(whole.read_text()[:-7])
    for path in (tmp_path / "cut.json", tmp_path / "absent.json"):
        fresh = counting.StepCounts()
        fresh.adopt(path)
        assert fresh.keys() == []
    fresh.adopt(whole)
    assert fresh.get(("k", 1)) == (StepFlops(2, 3, {"mm": 3}, "fake tensors"), None)


def test_grouped_query_attention_counts_as_its_key_and_value_repeated_to_the_query_heads() -> None:
    """Key and value with fewer heads than the query (Llama 2/3, Mistral, Qwen; SDPA's
    ``enable_gqa``), which torch's formulas refuse: counted exactly as the same attention with
    key and value repeated to the query's heads, a forward F = 4·B·Hq·Lq·Lk·D, a backward 2F of
    model FLOPs and F/2 of score recompute, whichever way the kernel is handed them."""
    from shardbench.prediction.flops import sdpa_backward_flops, sdpa_forward_flops

    b, hq, hkv, lq, lk, d = 2, 8, 2, 12, 20, 16
    q, kv = (b, hq, lq, d), (b, hkv, lk, d)
    repeated = (b, hq, lk, d)
    forward = 4 * b * hq * lq * lk * d
    assert sdpa_forward_flops(q, kv, kv) == sdpa_forward_flops(q, repeated, repeated) == forward
    assert (
        sdpa_backward_flops(q, q, kv, kv)
        == sdpa_backward_flops(q, q, repeated, repeated)
        == 2 * forward + forward // 2
    )

    def attention(gqa: bool):
        def loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
            query = model.weight * x[..., :lq, :]
            key = value = x[:, :hkv] if gqa else x[:, :hkv].repeat_interleave(hq // hkv, dim=1)
            return F.scaled_dot_product_attention(query, key, value, enable_gqa=gqa).sum()

        return count_step_flops(nn.Linear(1, 1), loss, lambda: torch.randn(b, hq, lk, d), device=CPU)

    grouped, plain = attention(gqa=True), attention(gqa=False)
    assert (
        (grouped.model, grouped.hardware)
        == (plain.model, plain.hardware)
        == (3 * forward, 3 * forward + forward // 2)
    )
    assert grouped.by_op == plain.by_op
    assert grouped.by_op["aten._scaled_dot_product_flash_attention_for_cpu"] == forward


@pytest.mark.parametrize("kernel", ["flash", "efficient"])
def test_cudas_fused_kernels_count_grouped_query_attention(kernel: str) -> None:
    """CUDA's flash and memory-efficient kernels handed key and value of fewer heads (counted
    here on their fake-tensor shapes): the forward and backward of the query's heads."""
    b, hq, hkv, s, d = 2, 8, 2, 16, 16
    aten = torch.ops.aten

    def loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        q, kv = (model.weight * x).to(torch.bfloat16), x[:, :hkv].to(torch.bfloat16)
        if kernel == "flash":
            return aten._scaled_dot_product_flash_attention(q, kv, kv, 0.0, False, False)[0].float().sum()
        return (
            aten._scaled_dot_product_efficient_attention(q, kv, kv, None, True, 0.0, False)[0].float().sum()
        )

    flops = count_step_flops(nn.Linear(1, 1), loss, lambda: torch.randn(b, hq, s, d), device=CPU)
    forward = 4 * b * hq * s * s * d
    assert flops.by_op == {
        f"aten._scaled_dot_product_{kernel}_attention": forward,
        f"aten._scaled_dot_product_{kernel}_attention_backward": 2 * forward,
        SCORE_RECOMPUTE: forward // 2,
    }
