"""The training precisions a cell can ask for, and what each means for tensors: the 16-bit
dtype its compute runs in, the bytes a 16-bit-kept parameter or gradient element takes, and
whether its loss needs scaling (fp16's five exponent bits underflow small gradients; bf16 has
fp32's range and needs none). One place, so strategies, the memory formula, the communication
volume and the FLOP peak read the same answer."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PRECISIONS = ("fp32", "bf16", "fp16")

#: the precisions whose compute runs in a 16-bit dtype, by torch's name for that dtype
_HALF_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def compute_dtype(precision: str) -> torch.dtype | None:
    """The 16-bit dtype ``precision`` computes in (autocast's, or the parameters' where a strategy
    keeps 16-bit parameters); None for fp32."""
    import torch

    name = _HALF_DTYPES.get(precision)
    return getattr(torch, name) if name is not None else None


def is_half(precision: str) -> bool:
    """True for a 16-bit precision (bf16, fp16)."""
    return precision in _HALF_DTYPES


def element_bytes(precision: str) -> int:
    """Bytes per parameter or gradient element a strategy keeps in 16-bit at ``precision`` (and
    communicates): 2 for bf16 and fp16, else 4."""
    return 2 if is_half(precision) else 4


def loss_scaled(precision: str) -> bool:
    """Whether training at ``precision`` scales its loss (a gradient scaler): fp16 only."""
    return precision == "fp16"
