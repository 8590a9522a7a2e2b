"""How well the step-time model predicted the cells a run measured: each cell's predicted over
measured step time (``Record.predicted_step_time`` over the median of its timed steps), and over
a run's cells the median absolute error, ``median(|predicted - measured| / measured)``."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from shardbench.records import Record
from shardbench.wording import count


def predicted_over_measured(r: Record) -> float | None:
    """The cell's predicted step time over its measured median; None where either is missing."""
    predicted = r.predicted_step_time.step if r.predicted_step_time else None
    measured = (r.step_time_s or {}).get("median")
    if r.status != "ok" or r.simulated or not predicted or not measured:
        return None
    return predicted / measured


def median_absolute_error(records: Sequence[Record]) -> tuple[float, int] | None:
    """The median of ``|predicted/measured - 1|`` over the cells with both, and how many."""
    errors = [abs(ratio - 1) for r in records if (ratio := predicted_over_measured(r)) is not None]
    return (statistics.median(errors), len(errors)) if errors else None


def error_line(records: Sequence[Record]) -> str | None:
    """One line for a run's end: the model's median absolute error, its cells and its profiles."""
    found = median_absolute_error(records)
    if found is None:
        return None
    error, cells = found
    networks = sorted({r.predicted_step_time.network for r in records if r.predicted_step_time} - {None})
    return (
        f"predicted step time: median absolute error {error:.0%} over {count(cells, 'cell')} "
        f"(network {', '.join(networks)}; the model: docs/measuring.md#predicted-step-time)"
    )
