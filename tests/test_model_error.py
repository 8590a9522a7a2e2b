"""A predicted step's interval from this machine's earlier checks of the model: kept per machine
and device kind, the range of the newest checks' pred/meas ratios, none from too few; and
plan calls two strategies predicted equal where their intervals overlap."""

from __future__ import annotations

import pytest

from shardbench.prediction import model_error
from shardbench.prediction.model_error import (
    MINIMUM,
    WINDOW,
    add_check,
    interval_from,
    overlap,
    ratios_for,
    read_checks,
    with_interval,
)
from shardbench.step_figures import PredictedStep
from tests.records import make_record


def test_an_interval_covers_the_range_of_the_checks_ratios() -> None:
    ratios = [0.80 + 0.02 * k for k in range(21)]  # 0.80 .. 1.20
    low, high = interval_from(2.0, ratios[::-1])
    # the lowest and highest, 0.80 and 1.20: the measured step lies in step / ratio
    assert low == pytest.approx(2.0 / 1.20) and high == pytest.approx(2.0 / 0.80)
    assert interval_from(2.0, ratios[: MINIMUM - 1]) is None


def test_checks_are_kept_per_machine_device_kind_and_compute_basis_newest_window(tmp_path) -> None:
    def check(name: str, device: str, ratio: float, basis: str | None = "measured") -> None:
        add_check({"device_name": name, "device": device, "compute": basis, "ratio": ratio}, tmp_path)

    for k in range(WINDOW + 5):
        check("cpu-a", "cpu", 1.0 + k / 1000)
    check("cpu-b", "cpu", 3.0)
    check("cpu-a", "cuda", 5.0)
    check("cpu-a", "cpu", 7.0, basis="replayed")
    check("cpu-a", "cpu", 9.0, basis=None)  # says no basis: counted under none
    checks = read_checks(tmp_path)
    assert len(checks) == WINDOW + 9 and all("checked_at" in c for c in checks)
    mine = ratios_for(checks, "cpu-a", "cpu", "measured")
    assert len(mine) == WINDOW and mine[0] == pytest.approx(1.005) and mine[-1] == pytest.approx(1.044)
    assert ratios_for(checks, "cpu-b", "cpu", "measured") == [3.0]
    assert ratios_for(checks, "cpu-a", "cpu", "replayed") == [7.0]
    assert ratios_for(checks, "cpu-a", "cpu", "flops") == []
    step = PredictedStep(step=1.0, compute_basis="measured")
    assert with_interval(step, "cpu-b", "cpu", tmp_path) is step  # one check: no interval
    assert with_interval(step, "cpu-a", "cpu", tmp_path).interval is not None
    # a plan's prediction (its compute replayed) takes no interval from the timed cells' checks
    planned = PredictedStep(step=1.0, compute_basis="replayed")
    assert with_interval(planned, "cpu-a", "cpu", tmp_path) is planned


def test_the_file_keeps_at_most_its_limit(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(model_error, "KEPT", 3)
    for k in range(5):
        add_check({"device_name": "x", "device": "cpu", "ratio": float(k)}, tmp_path)
    assert [c["ratio"] for c in read_checks(tmp_path)] == [2.0, 3.0, 4.0]


def test_overlap() -> None:
    assert overlap([1, 2], [2, 3]) and overlap([1, 3], [1.5, 2]) and not overlap([1, 2], [2.1, 3])
    assert not overlap(None, [1, 2])


def test_plan_calls_strategies_whose_intervals_overlap_predicted_equal() -> None:
    """zero2 is predicted 25% faster than ddp: past the 10% margin, but within what this machine's
    checks say the model misses by; with narrower intervals it is faster."""
    from shardbench.report.plan_report import _tie_text
    from shardbench.studies.plan import Plan, PlanRow, fastest
    from shardbench.studies.plan_reserve import ReservePolicy

    def row(strategy: str, step: float, spread: float) -> PlanRow:
        predicted = {"step": step, "compute": step, "interval": [step * (1 - spread), step * (1 + spread)]}
        record = make_record(strategy=strategy, peak_mem_bytes={"max": 50})
        return PlanRow(strategy, record, 100, predicted=predicted)

    ddp, zero2 = row("ddp", 1.0, 0.2), row("zero2", 0.75, 0.2)
    assert fastest([ddp, zero2]) is ddp
    plan = Plan(rows=(ddp, zero2), budget=100, policy=ReservePolicy("cpu"), batch=1)
    assert "predicted equal to zero2" in _tie_text(plan, ddp)
    assert fastest([row("ddp", 1.0, 0.05), row("zero2", 0.75, 0.05)]).strategy == "zero2"


def test_plan_shows_the_interval_as_the_measured_steps_range_around_the_prediction() -> None:
    from shardbench.report.plan_report import _predicted
    from shardbench.studies.plan import PlanRow

    record = make_record(strategy="ddp", peak_mem_bytes={"max": 50})
    row = PlanRow("ddp", record, 100, predicted={"step": 1.2, "compute": 1.2, "interval": [1.02, 1.43]})
    assert _predicted(row)[0] == "1.20 s -15/+19%"
    assert _predicted(PlanRow("ddp", record, 100, predicted={"step": 1.2, "compute": 1.2}))[0] == "1.20 s"
