"""The training precisions a cell can ask for, and what each means for tensors: the 16-bit
dtype its compute runs in, the bytes each model-state element takes, and whether its loss needs
scaling (fp16's five exponent bits underflow small gradients; bf16 has fp32's range and needs
none). One place, so strategies, the memory formula, the communication volume, the step-time
prediction and the FLOP peak read the same answer."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch

PRECISIONS = ("fp32", "bf16", "fp16")

#: the precisions whose compute runs in a 16-bit dtype, by torch's name for that dtype
_HALF_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


class ModelStateBytes(NamedTuple):
    """Bytes per parameter element of each model state AdamW training keeps at a precision."""

    parameter: int
    gradient: int
    #: AdamW's ``exp_avg`` and ``exp_avg_sq``, and the fp32 master weights where the parameters
    #: are 16-bit
    optimizer: int


#: per precision, the model states of ZeRO's accounting (section 5 of the paper): fp32 keeps
#: 4 + 4 + 8 bytes a parameter; 16-bit mixed precision keeps 2 + 2 + 12 (fp32 masters and moments)
MODEL_STATE_BYTES: dict[str, ModelStateBytes] = {
    "fp32": ModelStateBytes(4, 4, 8),
    "bf16": ModelStateBytes(2, 2, 12),
    "fp16": ModelStateBytes(2, 2, 12),
}


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
    communicates): 2 for bf16 and fp16, 4 for fp32."""
    return MODEL_STATE_BYTES[precision].parameter


def loss_scaled(precision: str) -> bool:
    """Whether training at ``precision`` scales its loss (a gradient scaler): fp16 only."""
    return precision == "fp16"
