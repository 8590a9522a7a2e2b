"""docs/strategies.md's figures are what the commands it names print: the table of where
FairScale's zero2 peaks lower gives our zero2's peak as ``run`` measures it now (ours repeats to
the byte; FairScale's moves between runs, so the page gives its range)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.cells import run_cell_here, tiny_cell

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


def zero2_at_two_ranks(workload: str) -> str:
    """Our zero2's N=2 peak in the row of ``workload`` of "Where FairScale's zero2 peaks
    lower", as the page writes it (MiB, two decimals)."""
    text = (ROOT / "docs/strategies.md").read_text()
    section = text[text.index("### Where FairScale's zero2 peaks lower") :]
    (figures,) = re.findall(rf"^\| {workload} \| ([^|]+) \|", section, re.M)
    return figures.split("/")[0].strip()


def test_the_fairscale_table_gives_the_zero2_peak_run_measures() -> None:
    """deepspeech2 tiny zero2 at N=2 (batch 8, fp32, real ranks, run's steps): the page's
    command, one cell of it."""
    cell = tiny_cell(workload="deepspeech2", strategy="zero2", batch_size=8, steps=5, warmup=2)
    record = run_cell_here(cell)
    assert record.status == "ok", record.error
    assert zero2_at_two_ranks("deepspeech2") == f"{record.peak_mem_bytes['max'] / MIB:.2f}"
