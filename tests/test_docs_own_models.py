"""docs/own-models.md shows what a plan of ``examples/mymodel.py`` prints: the kernels line of a
CUDA plan made on this machine, the attention kernel and why it is the one named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from shardbench.cli import main
from shardbench.harness import runner
from tests.cells import run_cell_here

ROOT = Path(__file__).resolve().parents[1]


def documented_kernels_line() -> str:
    """The kernels line docs/own-models.md shows for the example's CUDA plan."""
    (line,) = re.findall(r"^ {4}(kernels assumed .*)$", (ROOT / "docs/own-models.md").read_text(), re.M)
    return line


@pytest.mark.skipif(torch.cuda.is_available(), reason="the page shows a CUDA plan made without a GPU")
def test_the_kernels_line_of_the_example_is_what_its_cuda_plan_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The README's plan of examples/mymodel.py (nn.MultiheadAttention in its blocks), one
    strategy of it: the line under the table reads as the page shows it, once unwrapped."""
    monkeypatch.chdir(ROOT)  # the example's path is relative to the checkout
    monkeypatch.setattr(runner, "run_cell", lambda cell, *, run_id: run_cell_here(cell, run_id=run_id))
    argv = ["plan", "--workload", "examples/mymodel.py:factory", "--world-size", "8", "--budget", "160MiB"]
    argv += ["--device", "cuda", "--strategy", "ddp", "--out", str(tmp_path / "plan")]
    assert main(argv) == 0
    printed = " ".join(capsys.readouterr().out.split())
    (line,) = re.findall(r"kernels assumed .*?(?= report: |$)", printed)
    assert line == documented_kernels_line()
