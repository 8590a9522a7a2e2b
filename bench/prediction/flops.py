"""The FLOPs of one training step on one rank, counted with torch's FLOP formulas
(``torch.utils.flop_counter``'s registry) over the forward and backward of the rank's own batch.

Two counts per step:

* **model FLOPs**: the step's math done once, a forward and a backward; the numerator of MFU
  (PaLM's model FLOPs utilisation). Activation checkpointing does not change it.
* **hardware FLOPs**: what the step executes, activation checkpointing's recompute of each
  unit's forward included; the numerator of HFU. Without checkpointing the two are equal.

One pass gives both: what runs while a checkpointed unit recomputes its forward
(``models.checkpointing.recomputing``) is booked as the recompute, and the rest is the model's.

Counted on the model as the workload built it, before a strategy wraps it: no collective runs
and no strategy hook sees the pass. A rank computes its own micro-batch through the whole model
under every strategy (sharding changes where parameters live, not the math done with them), so
the count is the same for ddp, zero3 or FSDP2.

The pass runs under FakeTensorMode: shapes without data, so nothing is computed or allocated
(a base-size transformer counts in well under a second). The model's parameters and buffers are
swapped for fake copies with ``torch.func.functional_call``, forward *and* backward inside it (a
checkpointed unit recomputes in backward and must see the copies too); gradients go to the
copies, so the model itself is untouched. A workload whose shapes depend on its data's values
(``Workload.not_plannable``) has no fake-tensor pass: it is counted on real tensors, one forward
and backward outside the timed steps, its gradients going to detached leaves, its norm buffers
to copies.

What is counted is what torch has formulas for: matrix products (``mm``,
``addmm``, ``bmm``, ``baddbmm``), convolutions and the attention kernels, forward and backward,
2 FLOPs per multiply-add. Elementwise ops, normalisation, softmax, embedding lookups, the loss
and the optimizer step count 0: at the sizes benchmarked they are a few percent of the matmul
work, and it is the convention MFU is reported in. Attention is counted over the full ``s x s``
score matrix, causal or not, whichever kernel runs: torch has no formula for the CPU's fused
kernel, so it is given CUDA's; and a fused kernel's backward recomputes the scores (``Q Kᵀ``
again), which torch counts in: that product goes to the hardware count only (``by_op``'s
``SCORE_RECOMPUTE``), so the plain ``bmm`` path and a fused kernel count the same model FLOPs.
Grouped-query attention (key and value with fewer heads than the query, as Llama 2/3, Mistral
and Qwen have) is counted as the attention with key and value repeated to the query's heads:
each query head still multiplies against a whole key and value, so the products are the same;
torch's formulas refuse the shapes, so ours widen them first.
On CUDA the count runs with cuDNN off, so a recurrent layer is counted as the matrix products
it is made of rather than as a fused kernel torch has no formula for.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from shardbench.models.checkpointing import recomputing
from shardbench.precision import is_half
from shardbench.step_figures import FlopsPerStep

if TYPE_CHECKING:
    from shardbench.prediction.op_calls import OpCall

LossFn = Callable[[nn.Module, Any], torch.Tensor]


#: the fused attention kernels whose arguments start ``(query, key, value, ...)``, their
#: backward ``(grad_out, query, key, value, ...)``: heads on dimension 1, as SDPA takes them
_SDPA_KERNELS = (
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",  # torch has no formula for the CPU's
)
#: the lower-level backward kernels torch has formulas for (query, key and value laid out
#: differently, counted by torch's formula as they are)
_KERNEL_BACKWARD = ("_flash_attention_backward", "_efficient_attention_backward")
#: the key ``by_op`` gives the score recompute of the fused attention kernels' backward
SCORE_RECOMPUTE = "attention score recompute"


def _heads_as_query(query: Any, kv: Any) -> Any:
    """A key or value shape ``(b, h_kv, s, d)`` grouped under the query's ``h_q`` heads (``h_q``
    a multiple of ``h_kv``), as ``(b, h_q, s, d)``: the shape it has repeated to them, which
    the kernel does in effect. Any other shape is left for torch's formula to judge."""
    if len(query) == len(kv) == 4 and kv[1] and kv[1] != query[1] and query[1] % kv[1] == 0:
        return (kv[0], query[1], *kv[2:])
    return kv


def sdpa_forward_flops(query: Any, key: Any, value: Any) -> int:
    """torch's forward count of ``(query, key, value)`` shapes, grouped-query attention's key
    and value taken repeated to the query's heads (see the module docstring)."""
    from torch.utils import flop_counter

    return flop_counter.sdpa_flop_count(query, _heads_as_query(query, key), _heads_as_query(query, value))


def sdpa_backward_flops(grad_out: Any, query: Any, key: Any, value: Any) -> int:
    """torch's backward count (score recompute included) of the shapes, grouped-query
    attention's key and value taken repeated to the query's heads: their gradients are the
    repeated ones' summed over each group, and a sum is no product."""
    from torch.utils import flop_counter

    return flop_counter.sdpa_backward_flop_count(
        grad_out, query, _heads_as_query(query, key), _heads_as_query(query, value)
    )


def _attention_mapping(recomputed: list[int]) -> dict[Any, Any]:
    """Formulas for attention: the fused kernels (the CPU's too, which torch
    has no formula for) counted as torch counts CUDA's but for grouped-query attention too, and
    every fused backward counted without its recompute of the score matrix (the 5th of its
    products torch counts: ``Q Kᵀ`` again), which goes to ``recomputed`` instead. A fused kernel
    and the plain ``bmm`` path then count the same model FLOPs, and the recompute is the
    hardware's."""
    from torch.utils import flop_counter

    aten, mapping = torch.ops.aten, {}
    forward = flop_counter.shape_wrapper(
        lambda q, k, v, *args, out_shape=None, **kwargs: sdpa_forward_flops(q, k, v)
    )
    backward = flop_counter.shape_wrapper(
        lambda grad, q, k, v, *args, out_shape=None, **kwargs: sdpa_backward_flops(grad, q, k, v)
    )
    for name in _SDPA_KERNELS:
        kernel, kernel_backward = getattr(aten, name, None), getattr(aten, f"{name}_backward", None)
        if kernel is not None:
            mapping[kernel] = forward
        if kernel_backward is not None:
            mapping[kernel_backward] = _without_score_recompute(backward, recomputed)
    for name in _KERNEL_BACKWARD:
        packet = getattr(aten, name, None)
        if packet is not None and packet in flop_counter.flop_registry:
            mapping[packet] = _without_score_recompute(flop_counter.flop_registry[packet], recomputed)
    return mapping


def _without_score_recompute(formula: Callable[..., int], recomputed: list[int]) -> Callable[..., int]:
    """torch's count of a fused backward ``(grad, q, k, v, ...)`` is ``2·b·h·s_q·s_k·(3·d_q +
    2·d_v)``, of which ``2·b·h·s_q·s_k·d_q`` recomputes the scores: split it off, exactly."""

    def model_part(*args: Any, **kwargs: Any) -> int:
        total = formula(*args, **kwargs)
        d_q, d_v = args[1].shape[-1], args[3].shape[-1]
        recompute = total * d_q // (3 * d_q + 2 * d_v)
        recomputed.append(recompute)
        return total - recompute

    return model_part


def matmul_dtype(precision: str, device_type: str) -> str:
    """The dtype a step's matrix products run at, which picks the peak they are set against:
    bf16 or fp16 for a cell of that precision; for fp32, TF32 where CUDA is allowed to use it
    for float32 products (``torch.backends.cuda.matmul.allow_tf32``, off by default), else fp32."""
    if is_half(precision):
        return precision
    if device_type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "fp32"


@dataclass(frozen=True)
class StepFlops:
    """One rank's step: its model and hardware FLOPs, the hardware count per op, and how it
    was counted ("fake tensors" or "real tensors")."""

    model: int
    hardware: int
    by_op: dict[str, int]
    counted_on: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StepFlops:
        return cls(**d)

    def to_record(
        self, batch: int, tokens_per_sample: int | None, dtype: str, count_s: float | None = None
    ) -> FlopsPerStep:
        """The record's ``flops_per_step``: the counts, per sample and per token (where the
        workload has a sequence), the matmul dtype the step ran at and the count's seconds."""
        tokens = batch * tokens_per_sample if tokens_per_sample else None
        return FlopsPerStep(
            model=self.model,
            hardware=self.hardware,
            per_sample={"model": self.model / batch, "hardware": self.hardware / batch},
            per_token={"model": self.model / tokens, "hardware": self.hardware / tokens} if tokens else None,
            batch=batch,
            tokens_per_sample=tokens_per_sample,
            dtype=dtype,
            by_op=dict(self.by_op),
            counted_on=self.counted_on,
            count_s=count_s,
        )


class ForwardBackward(nn.Module):
    """Forward and backward of ``loss(model, inputs)`` as one module call, so that
    ``functional_call`` keeps its substitute parameters in place through the backward (where a
    checkpointed unit recomputes its forward)."""

    def __init__(
        self, model: nn.Module, loss: LossFn, autocast: torch.dtype | None, device_type: str
    ) -> None:
        super().__init__()
        self.model = model
        self.loss, self.autocast, self.device_type = loss, autocast, device_type

    def forward(self, inputs: Any) -> torch.Tensor:
        mixed = (
            torch.autocast(self.device_type, dtype=self.autocast)
            if self.autocast is not None
            else contextlib.nullcontext()
        )
        with mixed:
            loss = self.loss(self.model, inputs)
        loss.backward()
        return loss.detach()


def _fake_mode() -> Any:
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
    except ImportError as e:
        raise RuntimeError(
            f"torch {torch.__version__} has no torch._subclasses.fake_tensor.FakeTensorMode; "
            "counting FLOPs without computing needs it"
        ) from e
    return FakeTensorMode()


@contextlib.contextmanager
def _counting_context(device: torch.device) -> Iterator[None]:
    """The RNG as it was before the count (a real pass draws dropout masks), and on CUDA cuDNN
    off (see the module docstring)."""
    devices = (
        [device.index if device.index is not None else torch.cuda.current_device()]
        if device.type == "cuda"
        else []
    )
    cudnn = torch.backends.cudnn.flags(enabled=False) if device.type == "cuda" else contextlib.nullcontext()
    with torch.random.fork_rng(devices=devices), cudnn:
        yield


def count_step(
    model: nn.Module,
    loss: LossFn,
    make_inputs: Callable[[], Any],
    *,
    device: torch.device,
    tensors: str = "fake",
    autocast: torch.dtype | None = None,
    record_calls: bool = False,
) -> tuple[StepFlops, tuple[OpCall, ...] | None]:
    """Count one step of ``loss(model, make_inputs())``, forward and backward; with
    ``record_calls``, beside the count the counted pass's operator calls (``op_calls``) for the
    op replay of the step's compute time (a pass the recording fails is counted again without
    it, no calls: the count never depends on it).

    ``tensors``: "fake" counts under a FakeTensorMode of its own; "active" under the
    FakeTensorMode already active (a ``--fake`` cell, whose model is made of fake tensors); "real"
    on real tensors (a workload fake tensors cannot run). ``autocast``: the dtype of the cell's
    autocast, if any. The model is left as it was: its parameters get no gradient, its buffers
    keep their values, the RNG its state."""
    return _count_step(model, loss, make_inputs, device, tensors, autocast, record=record_calls)


def count_step_flops(model: nn.Module, loss: LossFn, make_inputs: Callable[[], Any], **how: Any) -> StepFlops:
    """``count_step``'s count alone (its keyword arguments, no calls recorded)."""
    return count_step(model, loss, make_inputs, **how)[0]


def _count_step(
    model: nn.Module,
    loss: LossFn,
    make_inputs: Callable[[], Any],
    device: torch.device,
    tensors: str,
    autocast: torch.dtype | None,
    *,
    record: bool,
) -> tuple[StepFlops, tuple[OpCall, ...] | None]:
    if tensors not in ("fake", "active", "real"):
        raise ValueError(f"tensors must be 'fake', 'active' or 'real', got {tensors!r}")
    step = ForwardBackward(model, loss, autocast, device.type)
    mode = _fake_mode() if tensors == "fake" else contextlib.nullcontext()
    with _counting_context(device), mode:
        state = _substitute_state(step, mode if tensors == "fake" else None)
        inputs = make_inputs()
        counted, calls = _hardware_pass(step, state, inputs, record)
        del state, inputs
    counted_on = "real tensors" if tensors == "real" else "fake tensors"
    model_flops = counted.executed - counted.recompute
    return StepFlops(model_flops, counted.executed + counted.scores, counted.by_op, counted_on), calls


def _substitute_state(step: ForwardBackward, fake: Any | None) -> dict[str, torch.Tensor]:
    """The parameters and buffers the counted pass runs on: fake copies under ``fake``, else
    leaves of their own sharing the parameters' storage, and buffers copied."""
    if fake is not None:
        return {n: fake.from_tensor(t) for n, t in _tensors(step)}
    params = {n: p.detach().requires_grad_(p.requires_grad) for n, p in step.named_parameters()}
    return {**params, **{n: b.clone() for n, b in step.named_buffers()}}


def _hardware_pass(
    step: ForwardBackward, state: dict[str, torch.Tensor], inputs: Any, record: bool
) -> tuple[PassCount, tuple[OpCall, ...] | None]:
    """The executed pass's count, and with ``record`` its calls: a recording that fails costs
    the calls only, the pass is counted again without it."""
    if not record:
        return _count(step, state, inputs), None
    from shardbench.prediction.op_calls import CallRecorder

    recorder = CallRecorder()
    try:
        return _count(step, state, inputs, recorder), recorder.calls()
    except Exception:  # noqa: BLE001 - the recording's failure costs the calls only
        _clear_grads(state)
        return _count(step, state, inputs), None


def _tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*module.named_parameters(), *module.named_buffers()]


def _clear_grads(state: dict[str, torch.Tensor]) -> None:
    for t in state.values():
        t.grad = None


class PassCount(NamedTuple):
    """One counted pass: ``executed``, the FLOPs of every call but the fused attention's score
    recompute, which is ``scores``; ``recompute``, the part of ``executed`` that activation
    checkpointing's recompute ran; ``by_op``, per operator what ran (the score recompute under
    ``SCORE_RECOMPUTE``)."""

    executed: int
    scores: int
    recompute: int
    by_op: dict[str, int]


def _count(
    step: ForwardBackward, state: dict[str, torch.Tensor], inputs: Any, recorder: Any = None
) -> PassCount:
    """One pass, counted; its calls go to ``recorder`` where one is given."""
    from torch.func import functional_call

    recomputed: list[int] = []
    recording = recorder if recorder is not None else contextlib.nullcontext()
    with StepFlopCounter(_attention_mapping(recomputed)) as counter, recording:
        functional_call(step, state, (inputs,))
    by_op = {str(op): n for op, n in sorted(counter.by_op.items(), key=str)}
    if recomputed:
        by_op[SCORE_RECOMPUTE] = sum(recomputed)
    return PassCount(sum(counter.by_op.values()), sum(recomputed), counter.recompute, by_op)


class StepFlopCounter(TorchDispatchMode):
    """The FLOPs of every operator call dispatched while it is active, by operator: torch's
    formulas (``flop_registry``, the ones ``FlopCounterMode`` applies) with ``formulas`` over
    them, and what ``FlopCounterMode`` does beside them: an operator without a formula is counted
    by the operators it decomposes into, where it has a decomposition (``nn.Linear`` under
    ``inference_mode`` reaches a mode whole), and ``torch.cond`` as its costlier branch. Only the
    step's totals by operator are wanted, so unlike ``FlopCounterMode`` it tracks no module
    hierarchy: that tracking's hooks on every module call took a third to a half of a small
    model's count."""

    supports_higher_order_operators = True

    def __init__(self, formulas: dict[Any, Callable[..., int]]) -> None:
        from torch.utils.flop_counter import flop_registry

        super().__init__()
        self.formulas = {**flop_registry, **formulas}
        self.by_op: dict[Any, int] = {}
        #: of those, what ran while a checkpointed unit recomputed its forward
        self.recompute = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return self._higher_order(func, args)
        op = func._overloadpacket
        formula = self.formulas.get(op)
        if formula is None and _decomposes(func):
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        if formula is not None:
            flops = int(formula(*args, **kwargs, out_val=out))
            self.by_op[op] = self.by_op.get(op, 0) + flops
            if recomputing():
                self.recompute += flops
        return out

    def _higher_order(self, func: Any, args: Any) -> Any:
        """``torch.cond``: under fake tensors the branch a step takes is unknown, so both are
        run and the costlier one counted, operator by operator, and the first branch's output
        returned (as ``FlopCounterMode`` does); any other higher-order operator is not counted
        (NotImplemented, which fails the count)."""
        if func is not getattr(torch.ops.higher_order, "cond", None):
            return NotImplemented
        _, true_branch, false_branch, operands = args
        before, recompute_before = self.by_op, self.recompute
        outputs, branches = [], []
        for branch in (true_branch, false_branch):
            self.by_op, self.recompute = {}, 0
            with self:
                outputs.append(branch(*operands))
            branches.append((self.by_op, self.recompute))
        self.by_op = dict(before)
        for op in {op for counted, _ in branches for op in counted}:
            self.by_op[op] = before.get(op, 0) + max(counted.get(op, 0) for counted, _ in branches)
        self.recompute = recompute_before + max(recompute for _, recompute in branches)
        return outputs[0]


#: operator -> whether it has a decomposition: asked once per operator, not on each of its calls
_DECOMPOSES: dict[Any, bool] = {}


def _decomposes(func: Any) -> bool:
    """Whether ``func.decompose`` would break ``func`` down (a CompositeImplicitAutograd kernel,
    in C++ or Python), as ``FlopCounterMode`` asks of an operator without a formula."""
    if (known := _DECOMPOSES.get(func)) is None:
        key = torch._C.DispatchKey.CompositeImplicitAutograd
        known = _DECOMPOSES[func] = func is not torch.ops.prim.device.default and (
            key in func.py_kernels or torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key)
        )
    return known
