"""The update replayed over the rank's own tensors (``update_probe.replay``): what it measures,
and that the step-time model takes it over the rate probe and the per-tensor cost where a record
lists the tensors' sizes, and falls back to them where the copies would not fit in memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardbench.prediction.record_step_time import predict_record
from shardbench.prediction.update_probe import REPEATS, REPLAY_FROM, replay
from shardbench.step_figures import FlopsPerStep
from tests.probes import plain_probes
from tests.records import make_record

PEAK = {"flops_per_s": 0.2e12, "kind": "measured"}
SIZES = [REPLAY_FROM - 1040, 16, 1024]  # REPLAY_FROM in all: the fewest replayed


def test_the_replay_steps_tensors_of_the_sizes_given() -> None:
    sizes = [4096, 16, 1024]
    out = replay(sizes, threads=1, copies=2)
    assert out["tensors"] == 3 and out["elements"] == sum(sizes) and out["copies"] == 2
    assert out["seconds"] > 0 and out["mad_seconds"] >= 0 and out["repeats"] == REPEATS


def _record(ranks: int, sizes: list[int] | None) -> Any:
    return make_record(
        strategy="ddp",
        world_size=ranks,
        params=sum(sizes or SIZES),
        flops_per_step=FlopsPerStep(model=1e9, hardware=1e9),
        placement={"ranks": ranks, "cores": 2},
        threads_per_rank=1,
        predicted_mem_bytes={"optimizer": 8 * sum(sizes or SIZES)},
        optimizer_tensors=len(sizes or SIZES),
        optimizer_tensor_elements=sizes,
    )


def _probes(home: Path, asked: list[tuple[Any, ...]]) -> Any:
    def replayed(sizes: list[int], threads: int, copies: int) -> dict[str, float]:
        asked.append((list(sizes), threads, copies))
        return {"seconds": 0.03}

    return plain_probes(home, measure_update_replay=replayed)


@pytest.mark.parametrize("ranks", [2, 4], ids=["a core a rank", "two ranks a core"])
def test_a_listed_rank_update_is_replayed_over_the_core_share(tmp_path: Path, ranks: int) -> None:
    asked: list[tuple[Any, ...]] = []
    predicted, why = predict_record(
        _record(ranks, SIZES), network="gloo", peak=PEAK, probes=_probes(tmp_path, asked)
    )
    assert why is None, why
    assert asked == [(SIZES, 1, 2)]  # the rank's sizes, at its threads, as many copies as cores
    share = 2 / ranks
    assert predicted.update == pytest.approx(0.03 / share)  # no rate, no per-tensor cost besides
    assert predicted.seconds_per_update_element == pytest.approx(0.03 / share / sum(SIZES))
    unlisted, _ = predict_record(
        _record(ranks, None), network="gloo", peak=PEAK, probes=_probes(tmp_path, asked)
    )
    assert unlisted.update == pytest.approx((sum(SIZES) * 1e-8 + len(SIZES) * 2e-5) / share)
    assert len(asked) == 1


def test_an_update_too_large_to_replay_beside_its_copies_takes_the_rate(tmp_path: Path, monkeypatch) -> None:
    """Unless a replay of it is kept: what was measured stands, whatever memory is free now."""
    import shardbench.harness.config as config

    asked: list[tuple[Any, ...]] = []
    monkeypatch.setattr(config, "available_memory", lambda: 10_000)  # bytes: far too few
    record = _record(2, SIZES)
    predicted, _ = predict_record(record, network="gloo", peak=PEAK, probes=_probes(tmp_path / "a", asked))
    assert asked == [] and predicted.update == pytest.approx(sum(SIZES) * 1e-8 + len(SIZES) * 2e-5)
    monkeypatch.setattr(config, "available_memory", lambda: None)  # unknown: replayed, and kept
    predict_record(record, network="gloo", peak=PEAK, probes=_probes(tmp_path / "b", asked))
    monkeypatch.setattr(config, "available_memory", lambda: 10_000)
    kept, _ = predict_record(record, network="gloo", peak=PEAK, probes=_probes(tmp_path / "b", asked))
    assert len(asked) == 1 and kept.update == pytest.approx(0.03)


def test_a_small_update_takes_the_rate_and_the_per_tensor_cost(tmp_path: Path) -> None:
    asked: list[tuple[Any, ...]] = []
    small = [REPLAY_FROM - 2, 1]  # one element fewer than the fewest replayed
    probes = _probes(tmp_path, asked)
    predicted, _ = predict_record(_record(2, small), network="gloo", peak=PEAK, probes=probes)
    assert asked == [] and predicted.update == pytest.approx(sum(small) * 1e-8 + 2 * 2e-5)


def test_the_first_copy_to_fail_ends_the_others_and_says_why() -> None:
    import time

    from shardbench.prediction.processes_at_once import MEET_TIMEOUT_S, run_at_once

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="failing_copy failed: copy 1 fails on purpose"):
        run_at_once("tests.failing_copy", {}, copies=2, timeout_s=60)
    assert time.monotonic() - started < MEET_TIMEOUT_S / 4  # copy 0 did not wait out its meeting
    assert run_at_once("tests.failing_copy", {}, copies=1, timeout_s=60) == [{"copy": 0}]
