"""``shardbench max-size``: bisection finds the boundary the probes' own peaks define; a probe
that crashes is recorded and stops the search as a failure (a timeout is retried once first).

The searches run their probes in this process (tests/cells.py), except the one with a crashing
probe, which goes through the real launcher: fresh processes, one of which fails."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

import shardbench.studies.maxsize as maxsize
from shardbench.cli import main
from shardbench.harness.config import CellConfig
from shardbench.records import Record, read_records
from tests.cells import measured_once, run_cell_here, tiny_cell

MIB = 2**20


def _base(**kw) -> CellConfig:
    return tiny_cell(world_size=8, batch_size=2, steps=1, warmup=1, simulate=True, **kw)


@pytest.fixture
def probes_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(maxsize, "run_cell", run_cell_here)


def test_parse_budget() -> None:
    assert maxsize.parse_budget("16GiB") == 16 * 2**30
    assert maxsize.parse_budget("1.5 GB") == 1_500_000_000
    assert maxsize.parse_budget("4096") == 4096
    for bad in ("16 gigs", "", "-1GiB", "0"):
        with pytest.raises(ValueError, match="budget"):
            maxsize.parse_budget(bad)


def test_ladder_search_returns_the_boundary_of_the_probes(tmp_path: Path, probes_here) -> None:
    budget = 100 * MIB  # tiny (~15 MiB) fits; small's model states alone (~440 MiB) do not
    summary = maxsize.search(
        _base(),
        budget=budget,
        vary="params",
        ladder=("tiny", "small", "base", "large"),
        out_dir=tmp_path,
        run_id="t",
    )
    info = summary.max_size
    fit, fail = info["largest_fit"], info["smallest_fail"]
    assert (fit["preset"], fail["preset"]) == ("tiny", "small")
    assert fit["peak_bytes"] <= budget < fail["peak_bytes"]  # measured, both sides
    records = read_records([tmp_path])
    probes = [r for r in records if r.suite == "max-size-probe"]
    assert [r.preset for r in probes] == ["tiny", "small"]  # base/large: model states > budget, never run
    assert records[-1].suite == "max-size" and records[-1].status == "ok"
    assert summary.params == fit["params"] and "largest fit: tiny" in summary.note


def test_a_crashing_probe_stops_the_search_as_an_error(tmp_path: Path, monkeypatch) -> None:
    """A probe that errors is a broken search, not a size that does not fit: the search stops
    with status error and the probe's first error line, never "nothing fits"."""
    real_run_cell = maxsize.run_cell

    def crash_small(cell: CellConfig, *, run_id: str):
        with monkeypatch.context() as m:
            if cell.preset == "small":
                m.setenv("SHARDBENCH_FAULT", "error:rank=0")
            return real_run_cell(cell, run_id=run_id)

    monkeypatch.setattr(maxsize, "run_cell", crash_small)
    summary = maxsize.search(
        _base(), budget=4 * 2**30, vary="params", ladder=("tiny", "small"), out_dir=tmp_path, run_id="t"
    )
    records = read_records([tmp_path])
    crashed = [r for r in records if r.preset == "small" and r.suite == "max-size-probe"]
    assert len(crashed) == 1 and crashed[0].status == "error" and "injected error" in crashed[0].error
    assert summary.status == "error" and summary.suite == "max-size" and records[-1] == summary
    assert summary.error.startswith("search stopped: probe small b=2 ended error: ")
    assert "injected error" in summary.error and "nothing fits" not in summary.note
    assert summary.max_size["largest_fit"] is None and summary.max_size["failed_probe"]["preset"] == "small"


def test_a_timeout_is_retried_once_with_twice_the_time(tmp_path: Path, monkeypatch) -> None:
    calls: list[float] = []

    def slow(cell: CellConfig, *, run_id: str) -> Record:
        calls.append(cell.timeout_s)
        record = run_cell_here(replace(cell, steps=1))
        return replace(record, status="timeout", error="timed out") if cell.preset == "small" else record

    monkeypatch.setattr(maxsize, "run_cell", slow)
    base = _base(timeout_s=7.0)
    summary = maxsize.search(
        base, budget=4 * 2**30, vary="params", ladder=("tiny", "small"), out_dir=tmp_path, run_id="t"
    )
    assert calls.count(14.0) == 1 and summary.status == "timeout"
    assert "ended timeout" in summary.error


def test_batch_search_finds_adjacent_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_once = measured_once()
    monkeypatch.setattr(maxsize, "run_cell", run_once)
    # A budget between the peaks at batch 3 and 4 (the peak grows linearly with the batch): batches
    # 1 and 2 predict 3, and 3 fits and 4 does not: four probes, two of them measured here first.
    probe = replace(_base(fake=True), suite="max-size-probe")
    p1, p2 = (run_once(replace(probe, batch_size=b), run_id="t").peak_mem_bytes["max"] for b in (1, 2))
    budget = int(p2 + 1.5 * (p2 - p1))
    summary = maxsize.search(_base(fake=True), budget=budget, vary="batch", out_dir=tmp_path, run_id="t")
    fit, fail = summary.max_size["largest_fit"], summary.max_size["smallest_fail"]
    assert fail["batch_size"] == fit["batch_size"] + 1
    assert fit["peak_bytes"] <= budget < fail["peak_bytes"]


def _batch_search_on(peak: Callable[[int], int], budget: int) -> tuple[int, list[int]]:
    """``_search_batch`` on a stand-in peak curve: the largest fit and the batches probed."""
    probed: dict[int, int] = {}

    def fits(b: int) -> bool:
        probed[b] = peak(b)
        return probed[b] <= budget

    values, lo, hi = maxsize._search_batch(fits, probed.get, budget)
    fit = values[lo]
    assert peak(fit) <= budget and (hi == len(values) or peak(values[hi]) > budget)
    assert hi == lo + 1
    return fit, list(probed)


@pytest.mark.parametrize(
    "peak, budget, most",
    [
        (lambda b: 1000 + 7 * b, 3000, 4),  # linear from batch 1: predicted, then its neighbour
        # zero2/zero3 with a big model: batches 1 and 2 peak in the optimizer step (only the inputs
        # grow), larger batches in the backward (activations): the 1.1B Llama's shape, six probes
        (lambda b: max(4_740_744_988 + 2048 * b, 3_850_000_000 + 296_739_280 * b), 80 << 30, 6),
        # activations that take over only at larger batches (steeper after a kink)
        (lambda b: max(5000 + b, 100 * b), 10**6, 8),
        # convex (superlinear) growth, where secants creep: bisection still ends it
        (lambda b: 100 + b * b, 10**6, 14),
    ],
    ids=["linear", "optimizer-peak-first", "kink", "convex"],
)
def test_batch_search_ends_beside_the_boundary_in_few_probes(peak, budget, most) -> None:
    fit, probed = _batch_search_on(peak, budget)
    assert len(probed) <= most, probed


def test_cli_validates_before_probing(tmp_path: Path, capsys) -> None:
    out = tmp_path / "o"
    argv = [
        "max-size",
        "--workload",
        "transformer",
        "--strategy",
        "ddp",
        "--world-size",
        "8",
        "--out",
        str(out),
    ]
    assert main([*argv, "--budget", "lots"]) == 2
    assert "cannot read memory budget" in capsys.readouterr().err
    assert main([*argv, "--budget", "1GiB", "--ladder", "tiny,huge"]) == 2
    assert "unknown preset 'huge'" in capsys.readouterr().err
    assert main([*argv, "--budget", "1GiB", "--ladder", "small,tiny"]) == 2
    assert "ladder must grow" in capsys.readouterr().err
    assert not out.exists()


def test_known_records_are_reused_and_bound_the_bisection(tmp_path: Path, monkeypatch) -> None:
    """The search logic alone, on stand-in probes whose peak is the preset's parameter count x 16
    bytes: a preset already measured is not run again, and the answer is the true boundary."""
    from shardbench.harness.result import RankResult, build_record
    from shardbench.models.registry import get_workload
    from shardbench.strategies.registry import get_strategy

    ran: list[str] = []

    def stand_in(cell: CellConfig, *, run_id: str):
        ran.append(cell.preset)
        peak = 16 * get_workload(cell.workload).param_count(cell.preset)
        result = RankResult(rank=0, num_params=peak // 16, step_times=[1.0], losses=[1.0],
                            tracked_peak=peak, breakdown={"params": peak})  # fmt: skip
        plan = get_strategy(cell.strategy).plan_world(cell.world_size, "cpu", True)
        return build_record(cell, plan, [result], run_id=run_id, wall_s=0.0, processes=1)

    monkeypatch.setattr(maxsize, "run_cell", stand_in)
    ladder = ("tiny", "small", "base", "h768-l18", "h768-l24", "large")
    known = {"base": stand_in(replace(_base(), preset="base"), run_id="t")}
    ran.clear()
    budget = 16 * 200_000_000  # between h768-l24 (194.5M) and h1024-l18 / large
    summary = maxsize.search(
        _base(), budget=budget, vary="params", ladder=ladder, out_dir=tmp_path, run_id="t", known=known
    )
    # the geometric middle of base (109.5M) and the ceiling large (335.1M) is h768-l24 (194.5M)
    assert "base" not in ran and ran == ["h768-l24", "large"]
    assert summary.max_size["largest_fit"]["preset"] == "h768-l24"
    assert summary.max_size["smallest_fail"]["preset"] == "large"


def _stand_in_probes(monkeypatch: pytest.MonkeyPatch, ran: list[str]) -> None:
    """Probes whose peak is 16 bytes per parameter, without running anything."""
    from shardbench.harness.result import RankResult, build_record
    from shardbench.models.registry import get_workload
    from shardbench.strategies.registry import get_strategy

    def stand_in(cell: CellConfig, *, run_id: str):
        ran.append(cell.preset)
        params = get_workload(cell.workload).param_count(cell.preset)
        result = RankResult(rank=0, num_params=params, step_times=[1.0], losses=[1.0],
                            tracked_peak=16 * params, breakdown={"params": 16 * params})  # fmt: skip
        plan = get_strategy(cell.strategy).plan_world(cell.world_size, "cpu", True)
        return build_record(cell, plan, [result], run_id=run_id, wall_s=0.0, processes=1)

    monkeypatch.setattr(maxsize, "run_cell", stand_in)


@pytest.mark.parametrize("workload", ["transformer", "imagegpt", "swav", "deepspeech2"])
@pytest.mark.parametrize("target", [37e6, 250e6, 1.3e9])
def test_a_family_search_ends_within_the_resolution(tmp_path: Path, monkeypatch, workload, target) -> None:
    """Along a size family the bisection ends with a measured fit and a measured non-fit at
    most 3% apart in parameters (or neighbours, where the family is coarser: below ~55M for
    bert's 24M-parameter embeddings), the fit at or under the true limit, in a handful of probes."""
    ran: list[str] = []
    _stand_in_probes(monkeypatch, ran)
    budget = int(16 * target)
    base = replace(_base(), workload=workload, world_size=1, strategy="ddp")
    summary = maxsize.search(base, budget=budget, vary="params", out_dir=tmp_path, run_id="t", progress=str)
    info = summary.max_size
    fit, fail = info["largest_fit"], info["smallest_fail"]
    assert fit["peak_bytes"] <= budget < fail["peak_bytes"]
    assert info["resolution"] == fail["params"] / fit["params"] - 1
    between = [n for n, _ in _members(workload) if fit["params"] < n < fail["params"]]
    assert fail["params"] <= 1.03 * fit["params"] or not between
    assert info["sizes"].startswith("family ") and info["target_resolution"] == 0.03
    assert len(ran) == info["probes"] <= 14
    # the probes follow the family's spine: on average nearer its usual proportions than the
    # members of the range they searched
    family = _family(workload)
    distance = {n: family.distance(**family.parse(n)) for n in ran}
    searched = [family.distance(**family.parse(n)) for c, n in family.members if c <= fail["params"]]
    assert sum(distance.values()) / len(ran) < sum(searched) / len(searched)


def _family(workload: str):
    from shardbench.models.registry import get_workload

    return get_workload(workload).size_family()


def _members(workload: str) -> tuple[tuple[int, str], ...]:
    return _family(workload).members


def test_a_coarser_resolution_takes_fewer_probes(tmp_path: Path, monkeypatch) -> None:
    counts = []
    for resolution in (0.03, 0.25):
        ran: list[str] = []
        _stand_in_probes(monkeypatch, ran)
        summary = maxsize.search(
            replace(_base(), world_size=1, strategy="ddp"),
            budget=16 * 300_000_000,
            vary="params",
            resolution=resolution,
            out_dir=tmp_path / str(resolution),
            run_id="t",
            progress=str,
        )
        assert summary.max_size["resolution"] <= resolution
        counts.append(len(ran))
    assert counts[1] < counts[0]


def test_resolution_is_validated_and_its_default_is_one(capsys) -> None:
    from shardbench.cli import max_size

    assert max_size.DEFAULT_RESOLUTION == maxsize.DEFAULT_RESOLUTION
    args = ["max-size", "--workload", "transformer", "--strategy", "ddp", "--world-size", "2"]
    assert main([*args, "--budget", "1GiB", "--resolution", "1.5"]) == 2
    assert "--resolution must be a fraction between 0 and 1" in capsys.readouterr().err
