"""Where torch learns whether CUDA is there: from NVML only where NVML can answer.

DeepSpeed and Lightning set ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` when imported, so that asking
``torch.cuda.is_available()`` never initialises CUDA in a process that forks later. Where the
NVML library cannot be loaded (a machine without an NVIDIA driver), torch tries to load it again
on every call, fails, and answers from the CUDA runtime as it would without the variable. Fake
tensors ask once per operator they have not cached, and every optimizer step asks once: a failed
library load each time, about a tenth of a fake cell's CPU time. There the variable changes no
answer and only costs, so a cell drops it before it measures; where NVML loads, it is kept.
"""

from __future__ import annotations

import functools
import os

import torch

NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


@functools.cache
def nvml_loads() -> bool:
    """Whether torch's NVML device count answers here (it returns -1 where NVML cannot load).
    A torch without that private function keeps the variable: True."""
    count = getattr(torch.cuda, "_device_count_nvml", None)
    return count is None or count() >= 0


def drop_where_nvml_cannot_answer() -> None:
    """Unset ``PYTORCH_NVML_BASED_CUDA_CHECK`` in this process where NVML cannot be loaded: torch
    then answers from the CUDA runtime directly, as it did after each failed load."""
    if os.environ.get(NVML_CHECK) == "1" and not nvml_loads():
        del os.environ[NVML_CHECK]
