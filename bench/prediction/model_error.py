"""How far this machine's step-time predictions have been from the steps it measured, kept so
that a new prediction carries an interval: the range its measured step should fall in.

Every measured cell checks the model (its ``predicted_step_time`` beside its measured median).
Each check on a quiet machine is kept, per machine, in the results home
(``peaks/model_error.json``: the CPU or GPU's name, the device kind, the predicted-over-measured
ratio, the compute it stood on, the cell and when). A prediction's interval is then the range
of the last ``WINDOW`` checks' ratios on that machine and device kind, from predictions whose
compute had the same basis (``PredictedStep.compute_basis``), turned into step times:
``[step / highest ratio, step / lowest ratio]``. With fewer than ``MINIMUM`` checks there is
no interval (an interval from three checks would say more than they know).

The whole range, not a central share of it: the model's error is not one spread around one
bias but differs by workload and strategy (on the 2-core machine's grid, deepspeech2 over-
predicted by 4-6% where swav's fsdp2-zero3 was under-predicted by 18%), so a new cell lies
inside a central share of the checks before it less often than that share says. Replayed over
that grid's checks in their order, 17 of its 25 cells fell inside the central 90% of the 40
checks before them, 20 inside their range.

The basis keeps the errors of two models apart: a cell that ran predicts from its own timed
forward and backward, a plan from the replay of its operators, and the replay's error is not the
timed pass's. So each measured cell that has both checks both: its own prediction, and the one a
plan would have made of it (``record_step_time.predict_record(timed_compute=False)``). A check
that does not say its basis counts only for a prediction that does not either.

Two predictions whose intervals overlap are "predicted equal" (``plan``): a difference the
model's own error on this machine could make. The checks of one machine share its systematic
error, so the overlap test is cautious: it calls equal what a careful reading of the model's
history cannot tell apart.

The window moves: checks a run made while other work kept the cores busy are replaced by the
next ``WINDOW`` checks (``shardbench env --remeasure`` drops them at once, with the probes).

Imports no torch.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from shardbench.paths import atomic_write_text, file_lock, results_home
from shardbench.step_figures import PredictedStep

#: the checks an interval is taken from: the newest this many on the machine and device kind
WINDOW = 40
#: fewer checks than this give no interval
MINIMUM = 8
#: checks kept in the file, newest last
KEPT = 1000


def history_path(home: Path | None = None) -> Path:
    return results_home(home) / "peaks" / "model_error.json"


def read_checks(home: Path | None = None) -> list[dict[str, Any]]:
    """Every check kept, oldest first (an unreadable file reads as none)."""
    try:
        data = json.loads(history_path(home).read_text())
    except (OSError, ValueError):
        return []
    checks = data.get("checks") if isinstance(data, dict) else None
    return [c for c in checks or [] if isinstance(c, dict) and isinstance(c.get("ratio"), int | float)]


def add_check(check: dict[str, Any], home: Path | None = None) -> None:
    """Keep ``check`` (``device_name``, ``device``, ``ratio`` and what names the cell)."""
    path = history_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path):
        checks = [*read_checks(home), {**check, "checked_at": time.strftime("%Y-%m-%dT%H:%M:%S")}]
        atomic_write_text(path, json.dumps({"checks": checks[-KEPT:]}, indent=1) + "\n")


def ratios_for(
    checks: Sequence[dict[str, Any]], device_name: str, device: str, basis: str | None
) -> list[float]:
    """The newest ``WINDOW`` checks' ratios on ``device_name`` as ``device``, of predictions
    whose compute stood on ``basis``."""
    key = (device_name, device, basis)
    mine = [
        float(c["ratio"]) for c in checks if (c.get("device_name"), c.get("device"), c.get("compute")) == key
    ]
    return mine[-WINDOW:]


def interval_from(step: float, ratios: Sequence[float]) -> list[float] | None:
    """The measured step's expected range around a predicted ``step``, from earlier checks'
    predicted-over-measured ``ratios``; None with fewer than ``MINIMUM``."""
    if len(ratios) < MINIMUM:
        return None
    return [step / max(ratios), step / min(ratios)]


def overlap(a: Sequence[float] | None, b: Sequence[float] | None) -> bool:
    """Whether two intervals overlap (False where either is missing)."""
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def interval_source(count: int) -> str:
    return f"the range of pred/meas over the last {count} checks on this machine"


def with_interval(
    predicted: PredictedStep, device_name: str, device: str, home: Path | None = None
) -> PredictedStep:
    """``predicted`` with its interval from this machine's checks of predictions on its basis
    (unchanged with too few)."""
    ratios = ratios_for(read_checks(home), device_name, device, predicted.compute_basis)
    interval = interval_from(predicted.step, ratios)
    return predicted if interval is None else replace(predicted, interval=interval)
