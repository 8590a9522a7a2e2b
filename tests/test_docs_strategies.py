"""docs/strategies.md's figures are what the commands it names print: the table of where
FairScale's zero2 peaks lower gives our zero2's peak as ``run`` measures it now (ours repeats to
the byte; FairScale's moves between runs, so the page gives its range)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shardbench.records import read_records

#: reads the smoke suite's run (conftest.py), made once by the worker of this group
pytestmark = pytest.mark.xdist_group("smoke_suite")

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


def zero2_at_two_ranks(workload: str) -> str:
    """Our zero2's N=2 peak in the row of ``workload`` of "Where FairScale's zero2 peaks
    lower", as the page writes it (MiB, two decimals)."""
    text = (ROOT / "docs/strategies.md").read_text()
    section = text[text.index("### Where FairScale's zero2 peaks lower") :]
    (figures,) = re.findall(rf"^\| {workload} \| ([^|]+) \|", section, re.M)
    return figures.split("/")[0].strip()


@pytest.mark.parametrize("workload", ["transformer", "swav", "deepspeech2", "imagegpt"])
def test_the_fairscale_table_gives_the_zero2_peak_run_measures(
    smoke_suite_run: dict[str, object], workload: str
) -> None:
    """Each tiny workload's zero2 at N=2 (batch 8, fp32, real ranks, run's steps): the page's
    command's cell, as the smoke suite runs it."""
    records = read_records([smoke_suite_run["out"]])
    (record,) = [r for r in records if (r.workload, r.strategy) == (workload, "zero2")]
    assert (record.preset, record.world_size, record.batch_size_per_rank) == ("tiny", 2, 8)
    assert record.status == "ok", record.error
    assert zero2_at_two_ranks(workload) == f"{record.peak_mem_bytes['max'] / MIB:.2f}"
