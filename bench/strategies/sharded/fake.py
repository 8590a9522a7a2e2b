"""Whether a tensor is a FakeTensor (``--fake`` planning): its shape and storage size exist,
its values do not, so code that would read values must take another path."""

from __future__ import annotations

import torch


def is_fake(tensor: torch.Tensor) -> bool:
    try:
        from torch._subclasses.fake_tensor import is_fake as _is_fake
    except ImportError:  # private API; without it there is no fake mode either
        return False
    return bool(_is_fake(tensor))
