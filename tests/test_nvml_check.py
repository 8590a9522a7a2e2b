"""``PYTORCH_NVML_BASED_CUDA_CHECK``, which DeepSpeed and Lightning set on import, is dropped by
a cell only where NVML cannot load (``bench/harness/nvml_check.py``): there torch's answer is the
same without it, and every fake operator stops paying for a failed library load."""

from __future__ import annotations

import os

import pytest
import torch

from shardbench.harness import nvml_check
from shardbench.harness.nvml_check import NVML_CHECK, drop_where_nvml_cannot_answer
from tests.cells import run_cell_here


def test_dropped_where_nvml_cannot_load_and_torch_answers_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NVML_CHECK, "1")
    monkeypatch.setattr(nvml_check, "nvml_loads", lambda: False)
    before = torch.cuda.is_available()
    drop_where_nvml_cannot_answer()
    assert NVML_CHECK not in os.environ
    assert torch.cuda.is_available() == before


@pytest.mark.parametrize("value", ["1", "0"])
def test_kept_where_nvml_loads_or_where_it_is_not_on(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(NVML_CHECK, value)
    monkeypatch.setattr(nvml_check, "nvml_loads", lambda: value == "1")
    drop_where_nvml_cannot_answer()
    assert os.environ[NVML_CHECK] == value


def test_a_cell_drops_it_before_it_measures(monkeypatch: pytest.MonkeyPatch, tiny_cell) -> None:
    """Set as a peer's or a model library's import sets it: the cell, run in this process, leaves
    it set only where NVML loads."""
    monkeypatch.setenv(NVML_CHECK, "1")
    r = run_cell_here(tiny_cell(world_size=4, fake=True, simulate=True))
    assert r.status == "ok", r.error
    assert os.environ.get(NVML_CHECK) == ("1" if nvml_check.nvml_loads() else None)
