"""Sizes and parameter counts read the same in every command: three significant figures in the
unit that keeps them, and a bracket's two ends never equal on the page when they differ."""

from __future__ import annotations

import pytest

from shardbench.harness.config import CellConfig
from shardbench.studies.maxsize import answer_line_from
from shardbench.units import MIB, apart, params_text, size_text


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [(8 * MIB, "8.00 MiB"), (133.1 * MIB, "133 MiB"), (99.96 * MIB, "100 MiB"), (1.364 * 2**30, "1.36 GiB"),
     (1020 * MIB, "0.996 GiB"), (512 * 1024, "512 KiB"), (300, "300 B")],
)  # fmt: skip
def test_a_size_keeps_three_significant_figures(nbytes, text) -> None:
    assert size_text(nbytes) == text


def test_two_different_values_never_read_equal() -> None:
    assert apart(params_text, 512_000, 512_400) == ("512K", "512.4K")
    assert apart(size_text, 7.90 * MIB, 7.904 * MIB) == ("7.900 MiB", "7.904 MiB")
    assert apart(params_text, 5_000_000, 5_000_000) == ("5M", "5M")


def test_a_small_search_reads_in_mib_and_its_bracket_ends_differ() -> None:
    """An 8 MiB budget is "8.00 MiB", never "0.01 GiB"; a largest fit and a smallest misfit of
    0.51M and 0.52M parameters never both read "(0.5M params)"."""
    cell = CellConfig(workload="transformer", preset="tiny", strategy="ddp", world_size=2)
    info = {
        "vary": "params",
        "budget_bytes": 8 * MIB,
        "largest_fit": {"preset": "a", "params": 510_000, "peak_bytes": int(7.8 * MIB), "status": "ok"},
        "smallest_fail": {"preset": "b", "params": 515_000, "peak_bytes": int(8.1 * MIB), "status": "ok"},
    }
    line = answer_line_from(info, cell)
    assert "budget 8.00 MiB" in line and "GiB" not in line
    assert "a (510K params), peak 7.80 MiB" in line and "b (515K params), peak 8.10 MiB" in line
