"""Which kernels a step ran, where memory depends on the kernel: the optimizer's implementation
and the attention backend.

Two choices change a step's memory without changing its arithmetic:

- **The optimizer implementation.** PyTorch's AdamW (and its siblings) has a per-parameter loop,
  a ``foreach`` path that updates every parameter of a device at once, and a ``fused`` kernel.
  ``foreach``'s temporaries (``sqrt(exp_avg_sq)`` and the like) are lists the size of the
  parameters: on CUDA, where torch picks it by default, they raise the optimizer step's peak by
  about 4 bytes a parameter. Torch decides when the optimizer first steps, from the parameters'
  type and device (``torch.optim.optimizer._default_to_fused_or_foreach``): under
  ``FakeTensorMode`` parameters are FakeTensors, not plain tensors, so it falls back to the loop
  and a plan would leave the temporaries out. ``pin_implementation`` therefore writes into each
  parameter group the implementation torch picks for plain tensors on the target device, before
  any strategy rebuilds the optimizer over its shards (they copy the groups' settings).
- **Scaled dot-product attention.** Flash and memory-efficient attention keep a log-sum-exp per
  query, linear in the sequence; the math path keeps the whole score matrix for backward,
  quadratic. Which one runs depends on the device, the dtypes and the mask.

``KernelWatch`` records what ran, from the operators dispatched during the tracked steps (the
same operators on fake and real tensors), so every record says which kernels its memory assumed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

#: torch's fused attention operators, by the name a record shows
ATTENTION_KERNELS = {
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "_scaled_dot_product_efficient_attention": "memory-efficient",
    "_scaled_dot_product_cudnn_attention": "cuDNN",
    "_flash_attention_forward": "flash",
    "_efficient_attention_forward": "memory-efficient",
}
NO_FUSED_ATTENTION = "none fused (the math path, or no attention)"
OPTIMIZER_IMPLEMENTATIONS = ("foreach", "fused", "for-loop")


def default_implementation(device_type: str) -> str:
    """The implementation torch's optimizers pick, when neither ``foreach`` nor ``fused`` is
    given, for plain tensors on ``device_type``: ``foreach`` where torch has foreach kernels for
    the device (CUDA), the per-parameter loop elsewhere (the CPU). Fused is never the default."""
    try:
        from torch.optim.optimizer import _get_foreach_kernels_supported_devices
    except ImportError as e:  # a private helper: without it, say so rather than guess
        raise RuntimeError(
            f"torch {torch.__version__} has no torch.optim.optimizer._get_foreach_kernels_supported_devices; "
            "a fake plan cannot tell which optimizer implementation the device would run"
        ) from e
    return "foreach" if device_type in _get_foreach_kernels_supported_devices() else "for-loop"


def pin_implementation(optimizer: torch.optim.Optimizer, device_type: str) -> torch.optim.Optimizer:
    """Write ``default_implementation(device_type)`` into every parameter group that leaves the
    choice to torch (``foreach`` None, ``fused`` unset); a choice the workload made is kept."""
    foreach = default_implementation(device_type) == "foreach"
    for group in optimizer.param_groups:
        if "foreach" in group and group["foreach"] is None and not group.get("fused"):
            group["foreach"] = foreach
    return optimizer


def pinned_factory(
    factory: Callable[[torch.nn.Module], torch.optim.Optimizer], device_type: str
) -> Callable[[torch.nn.Module], torch.optim.Optimizer]:
    """``factory``, with its optimizer's implementation pinned for ``device_type``."""

    def build(model: torch.nn.Module) -> torch.optim.Optimizer:
        return pin_implementation(factory(model), device_type)

    return build


class KernelWatch(TorchDispatchMode):
    """Records the attention operators dispatched inside it, and which optimizer implementation
    ran (``foreach``/``fused`` operators seen inside an optimizer's ``step``, else the loop)."""

    def __init__(self) -> None:
        super().__init__()
        self.attention: set[str] = set()
        self.optimizer: set[str] = set()
        self._in_step = 0
        self._saw_step = False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = func._opname if func.namespace == "aten" else ""
        if name in ATTENTION_KERNELS:
            self.attention.add(ATTENTION_KERNELS[name])
        elif self._in_step and name.startswith("_fused_"):
            self.optimizer.add("fused")
        elif self._in_step and name.startswith("_foreach_"):
            self.optimizer.add("foreach")
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def watching_steps(self) -> Iterator[KernelWatch]:
        """Inside it, every optimizer's ``step`` is seen (torch's global step hooks)."""
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        def pre(*_: Any) -> None:
            self._in_step += 1
            self._saw_step = True

        def post(*_: Any) -> None:
            self._in_step -= 1

        handles = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
        try:
            with self:
                yield self
        finally:
            for handle in handles:
                handle.remove()

    def summary(self) -> dict[str, str]:
        """``{"optimizer": ..., "attention": ...}``, as a record shows them."""
        if "fused" in self.optimizer:
            optimizer = "fused"
        elif "foreach" in self.optimizer:
            optimizer = "foreach"
        else:
            optimizer = "for-loop" if self._saw_step else "no optimizer step seen"
        attention = ", ".join(sorted(self.attention)) if self.attention else NO_FUSED_ATTENTION
        return {"optimizer": optimizer, "attention": attention}


class CudaAttention(TorchFunctionMode):
    """Scaled dot-product attention as CUDA would run it, for a plan made on the CPU (fake
    tensors: only shapes and storage sizes exist, so a CUDA kernel's meta function is all that
    runs). The CPU has no fused kernel for some inputs CUDA's have (dropout, for one) and falls
    back to the math path, which keeps the whole score matrix for backward; CUDA keeps a
    log-sum-exp per query. The choice follows CUDA's on a current card: flash for 16-bit inputs
    without a mask, memory-efficient attention for the rest of what it takes (fp32, masks,
    dropout), otherwise the call as it was (the math path)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            out = _cuda_sdpa(*args, **kwargs)
            if out is not None:
                return out
        if func is F.multi_head_attention_forward:
            # nn.MultiheadAttention's attention is called from inside this function, where no
            # mode sees it (a mode is off while it handles a call): route it for the call
            with _sdpa_routed():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def _sdpa_routed() -> Iterator[None]:
    """``F.scaled_dot_product_attention``, as torch's own functions look it up, answered as CUDA
    would (``_cuda_sdpa``) while inside; the CPU's where CUDA would use math."""
    cpu = F.scaled_dot_product_attention

    def routed(*args: Any, **kwargs: Any) -> torch.Tensor:
        out = _cuda_sdpa(*args, **kwargs)
        return cpu(*args, **kwargs) if out is None else out

    F.scaled_dot_product_attention = routed
    try:
        yield
    finally:
        F.scaled_dot_product_attention = cpu


def _cuda_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor | None:
    """The output of CUDA's fused kernel for these inputs, or None where CUDA would use math."""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or query.size(-1) > 256:
        return None
    if enable_gqa and key.size(1) != query.size(1):  # as the math path does: heads repeated
        repeat = query.size(1) // key.size(1)
        key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    needs_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if attn_mask is None and query.dtype in (torch.float16, torch.bfloat16):
        return torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale
        )[0]
    if query.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return None
    bias = None
    if attn_mask is not None:  # CUDA turns a boolean mask into an additive one, as here
        bias = attn_mask
        if attn_mask.dtype == torch.bool:
            bias = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device)
            bias = bias.masked_fill(~attn_mask, float("-inf"))
        bias = bias.to(query.dtype).expand(query.size(0), query.size(1), query.size(2), key.size(2))
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, needs_lse, dropout_p, is_causal, scale=scale
    )[0]
