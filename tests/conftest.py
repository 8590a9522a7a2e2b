"""Shared test fixtures. Tests run on CPU with gloo; one thread per process keeps N ranks on
two cores from thrashing."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture
def cuda_required() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA; none on this machine")
