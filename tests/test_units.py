"""Exact behaviour of the small pure pieces: timing statistics, the analytic model, records."""

import time

import pytest

from shardbench.metrics.analytic import Sharding, predicted_model_state_bytes
from shardbench.metrics.memory import breakdown_from_snapshot
from shardbench.metrics.timing import slowest_phases, slowest_rank, summarize
from shardbench.records import Record, append_record, read_records
from tests.records import make_record


def test_summarize_median_mad_percentiles() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["median"] == 3.0 and s["mad"] == 1.0 and s["n"] == 5
    assert s["p10"] == pytest.approx(1.4) and s["p90"] == pytest.approx(61.6)
    assert summarize([]) is None


def test_slowest_rank_per_step() -> None:
    assert slowest_rank([[1.0, 5.0], [2.0, 3.0]]) == [2.0, 5.0]


def test_each_phase_is_its_median_on_the_rank_slowest_in_it() -> None:
    def steps(*pairs: tuple[float, float]) -> list[dict[str, float]]:
        return [{"forward": f, "backward": b} for f, b in pairs]

    rank0, rank1 = steps((1, 4), (3, 2), (2, 3)), steps((5, 1), (5, 1), (1, 1))
    assert slowest_phases([rank0, rank1]) == {"forward": 5.0, "backward": 3.0}
    assert slowest_phases([[], []]) is None


def test_a_phase_clock_times_each_phase_since_the_last_mark() -> None:
    from shardbench.strategies.base import PhaseClock

    steps: list[dict[str, float]] = []
    clock = PhaseClock(steps)
    clock.mark("forward")
    time.sleep(0.01)
    clock.mark("backward")
    assert list(steps[0]) == ["forward", "backward"] and steps[0]["backward"] >= 0.01 > steps[0]["forward"]
    PhaseClock(None).mark("forward")  # untimed: nothing kept, nothing raised


@pytest.mark.parametrize(
    "sharding, n, expected",
    [
        (Sharding(), 4, 16 * 1000),
        (Sharding(optimizer_state=True), 4, 4000 + 4000 + 2000),
        (Sharding(optimizer_state=True, gradients=True), 4, 4000 + 3000),
        (Sharding(optimizer_state=True, gradients=True, parameters=True), 4, 4000),
    ],
)
def test_analytic_fp32(sharding, n, expected) -> None:
    assert predicted_model_state_bytes(1000, n, "fp32", sharding)["total"] == expected


def test_analytic_bf16_mixed_is_2_2_12() -> None:
    p = predicted_model_state_bytes(1000, 8, "bf16", Sharding(optimizer_state=True, gradients=True))
    assert (p["params"], p["grads"], p["optimizer"]) == (2000, 250, 1500)
    with pytest.raises(ValueError, match="allowed: fp32, bf16"):
        predicted_model_state_bytes(10, 1, "fp8", Sharding())


def test_breakdown_folds_tracker_categories() -> None:
    snap = {
        "Parameter": 4,
        "Buffer": 1,
        "Gradient": 4,
        "Activation": 3,
        "Temp": 2,
        "Optstate": 8,
        "Other": 5,
        "Total": 27,
    }
    assert breakdown_from_snapshot(snap) == {
        "params": 4,
        "grads": 4,
        "optimizer": 8,
        "activations": 5,
        "comm": 0,  # the tracker has no such type: the probe splits it off "other" at the peak
        "other": 6,
    }


def test_record_round_trip(tmp_path) -> None:
    r = make_record(
        steps=5,
        step_time_s={"median": 0.1, "mad": 0.0, "p10": 0.1, "p90": 0.1, "n": 5},
        mem_breakdown_bytes={"params": 1},
        env={"torch": "x"},
    )
    append_record(tmp_path / "records.jsonl", r)
    append_record(tmp_path / "records.jsonl", r)
    assert read_records([tmp_path]) == [r, r]
    with pytest.raises(AssertionError):
        Record(**{**r.to_json(), "status": "great"})
