"""A model's bare passes pooled across cells (``prediction/bare_pool.py``), and our reducer's
reduces to each owner costed as one pattern per bucket (``record_step_time.collectives``)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from shardbench.prediction.bare_pool import KEPT, bare_key, pool_path, pooled
from shardbench.prediction.record_step_time import BARE_SOURCE, collectives, predict_record
from shardbench.step_figures import BareCompute, FlopsPerStep
from shardbench.strategies.registry import get_strategy
from tests.probes import plain_probes
from tests.records import make_record

PEAK = {"flops_per_s": 0.2e12, "kind": "measured"}


def _record(seconds: float | None, passes: list[float] | None = None, **overrides: Any) -> Any:
    bare = BareCompute(seconds=seconds, threads=1, pass_seconds=passes) if seconds else None
    fields = {
        "flops_per_step": FlopsPerStep(model=1e9, hardware=1e9),
        "placement": {"ranks": 2, "cores": 2},
        "threads_per_rank": 1,
        "predicted_mem_bytes": {"optimizer": 8_000},
        "bare_compute": bare,
    }
    return make_record(**{**fields, **overrides})


def test_the_pool_is_the_median_of_the_newest_cells_of_one_model_at_one_placement(tmp_path: Path) -> None:
    times = [0.010, 0.050, 0.011, 0.012, 0.013, 0.014, 0.015, 0.016, 0.017, 0.018, 0.019]
    kept = [
        pooled(_record(t, strategy=s), tmp_path) for t, s in zip(times, ["ddp", "zero2"] * 6, strict=False)
    ]
    # the strategy is not in the key: every strategy's cell times the same bare model
    assert kept[0] == (0.010, 1, 1) and kept[1] == (pytest.approx(0.030), 2, 2)
    assert kept[2] == (0.011, 3, 3)  # a stalled cell's 50 ms moves the median by one place only
    assert kept[-1] == (statistics.median(times[-KEPT:]), KEPT, KEPT)  # the newest only
    # another world size, or batch, is another model at another placement
    other = _record(0.5, world_size=4, placement={"ranks": 4, "cores": 2})
    assert bare_key(other) != bare_key(_record(0.5)) and pooled(other, tmp_path) == (0.5, 1, 1)
    assert bare_key(_record(0.5, batch_size_per_rank=4)) != bare_key(_record(0.5))
    assert pooled(_record(None), tmp_path) is None


def test_the_pool_takes_the_median_of_passes_so_a_cell_of_one_pass_weighs_one_pass(tmp_path: Path) -> None:
    # two cells of one timed step, each a single slow pass (four ranks on two cores), then a
    # cell that timed three passes: its passes outnumber theirs
    assert pooled(_record(42.6, [42.6]), tmp_path) == (42.6, 1, 1)
    assert pooled(_record(44.4, [44.4]), tmp_path) == (pytest.approx(43.5), 2, 2)
    assert pooled(_record(28.0, [27.5, 28.0, 28.6]), tmp_path) == (28.6, 3, 5)
    assert pooled(_record(26.6, [26.6, 26.4, 27.0]), tmp_path) == (pytest.approx(27.75), 4, 8)
    # a cell's median alone would have given the median of 42.6, 44.4, 28.0, 26.6: 35.3
    stored = json.loads(pool_path(tmp_path).read_text())["entries"][bare_key(_record(1.0))]
    assert [e["passes"] for e in stored] == [[42.6], [44.4], [27.5, 28.0, 28.6], [26.6, 26.4, 27.0]]


def test_an_entry_kept_as_a_cells_median_counts_as_one_pass(tmp_path: Path) -> None:
    key = bare_key(_record(1.0))
    pool_path(tmp_path).parent.mkdir(parents=True)
    entries = {key: [{"seconds": 0.5, "at": "earlier"}, {"passes": [], "at": "empty"}, "not an entry"]}
    pool_path(tmp_path).write_text(json.dumps({"entries": entries}))
    assert pooled(_record(0.2, [0.1, 0.2, 0.3]), tmp_path) == (pytest.approx(0.25), 2, 4)


def test_the_prediction_takes_the_pooled_compute_where_kept(tmp_path: Path) -> None:
    probes = plain_probes(tmp_path)
    own = _record(0.02)
    alone, _ = predict_record(own, network="gloo", peak=PEAK, probes=probes)
    assert alone.compute == 0.02 and alone.compute_source == BARE_SOURCE
    own.bare_compute = BareCompute(
        seconds=0.02, threads=1, pooled_seconds=0.03, pooled_cells=5, pooled_passes=40
    )
    pooled_step, _ = predict_record(own, network="gloo", peak=PEAK, probes=probes)
    assert pooled_step.compute == 0.03 and pooled_step.step == pytest.approx(alone.step + 0.01)
    assert pooled_step.compute_source.startswith(BARE_SOURCE)
    assert "40 passes over this machine's newest 5 cells" in pooled_step.compute_source
    # a record whose pool held each cell's median says so
    own.bare_compute = BareCompute(seconds=0.02, threads=1, pooled_seconds=0.03, pooled_cells=5)
    earlier, _ = predict_record(own, network="gloo", peak=PEAK, probes=probes)
    assert earlier.compute == 0.03 and "newest 5 cells' timings of it" in earlier.compute_source


def _comm_record(strategy: str, ranks: int, grad_kind: str, calls: int) -> Any:
    grad_bytes = 4_000 * ranks
    return make_record(
        strategy=strategy,
        world_size=ranks,
        requested_world_size=ranks,
        comm_per_step={
            "ops": {
                grad_kind: {"bytes": grad_bytes, "calls": calls},
                "all_gather": {"bytes": grad_bytes, "calls": 3},
            }
        },
        predicted_comm={"ops": {grad_kind: {"bytes": grad_bytes}, "all_gather": {"bytes": grad_bytes}}},
    )


def test_our_reducers_reduces_to_each_owner_are_one_pattern_per_bucket() -> None:
    # zero2 at N = 4 on gloo: 3 buckets, each reduced to its 4 owners: 12 calls counted
    sent = collectives(_comm_record("zero2", 4, "reduce", 12), get_strategy("zero2"), "gloo", None)
    gradients = next(c for c in sent if c.role == "gradients")
    assert (gradients.kind, gradients.calls, gradients.nbytes) == ("reduce_to_owners", 3, 16_000)
    # FairScale's ShardedDDP reduces each gradient to its owner, one call each: as counted
    sent = collectives(
        _comm_record("fairscale-zero2", 4, "reduce", 12), get_strategy("fairscale-zero2"), "gloo", None
    )
    gradients = next(c for c in sent if c.role == "gradients")
    assert (gradients.kind, gradients.calls) == ("reduce", 12)
    # at N = 2 our reducer all-reduces each bucket
    sent = collectives(_comm_record("zero2", 2, "all_reduce", 3), get_strategy("zero2"), "gloo", None)
    assert next(c for c in sent if c.role == "gradients").kind == "all_reduce"
