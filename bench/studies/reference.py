"""The strategy every other one is set against, and a strategy's step time as a ratio to it.

The reference is declared once, on its strategy card (``Display.reference``: ddp, no sharding
at all); the report's ratio lines (``versus``), the regression gate's ratios
(``compare_ratios``), ``plan`` and ``claim`` all read it from here, and divide step times by the
one function below, so what the report shows is what the gate judges.
"""

from __future__ import annotations

from shardbench.records import Record
from shardbench.strategies.registry import reference_strategy

#: the reference strategy's name, as the strategy catalog declares it
REFERENCE = reference_strategy()


def step_time_ratio(ours: Record, base: Record) -> float | None:
    """``ours``'s median step time over ``base``'s (its group's reference cell); None where
    either has none."""
    mine = (ours.step_time_s or {}).get("median")
    theirs = (base.step_time_s or {}).get("median")
    return mine / theirs if mine is not None and theirs else None
