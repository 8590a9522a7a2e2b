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
from shardbench.studies.plan_reserve import Reserve
from tests.cells import measured_once, run_cell_here, stand_in_record, tiny_cell

MIB = 2**20


def _base(**kw) -> CellConfig:
    return tiny_cell(world_size=8, batch_size=2, steps=1, warmup=1, simulate=True, **kw)


@pytest.fixture
def probes_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(maxsize, "run_cell", run_cell_here)


def test_parse_budget() -> None:
    assert maxsize.parse_budget("16GiB") == 16 * 2**30
    assert maxsize.parse_budget("1.5 GB") == 1_500_000_000
    assert maxsize.parse_budget("4096B") == 4096
    for bad in ("16 gigs", "", "-1GiB", "0", "12"):
        with pytest.raises(ValueError, match="budget"):
            maxsize.parse_budget(bad)
    with pytest.raises(ValueError, match="unit"):  # a bare number could mean any unit
        maxsize.parse_budget("12")
    assert maxsize.parse_size("0", what="--reserve", zero=True) == 0  # nothing needs no unit


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
        if cell.preset == "small":  # what the launcher records when the deadline passes
            return replace(stand_in_record(cell, run_id=run_id), status="timeout", error="timed out")
        return run_cell_here(replace(cell, steps=1))

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
    ran: list[str] = []
    _stand_in_probes(monkeypatch, ran)
    ladder = ("tiny", "small", "base", "h768-l18", "h768-l24", "large")
    known = {"base": stand_in_record(replace(_base(), preset="base"))}
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

    def stand_in(cell: CellConfig, *, run_id: str):
        ran.append(cell.preset)
        return stand_in_record(cell, run_id=run_id)

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


LADDER = ("tiny", "small", "base", "large")


def _reserve_search(tmp_path: Path, monkeypatch, device: str, budget: int, lines: list[str]) -> Record:
    """A ddp search of the transformer ladder targeting ``device`` on stand-in probes (16 bytes a
    parameter), with the reserve ``plan`` keeps there."""
    from shardbench.studies.plan_reserve import policy

    _stand_in_probes(monkeypatch, [])
    cell = replace(_base(fake=True), device=device, strategy="ddp")
    return maxsize.search(
        cell,
        budget=budget,
        reserve=policy(device).of("ddp"),
        vary="params",
        ladder=LADDER,
        out_dir=tmp_path / device,
        run_id="t",
        progress=lines.append,
    )


def test_a_cuda_target_counts_plans_reserve_beside_every_peak(tmp_path: Path, monkeypatch) -> None:
    """A CUDA-targeted search judges a fit as ``plan`` does: a size whose peak fits the budget
    alone but not with the allocator's reserve is refused; the lines name the reserve; the record
    keeps what the decision used, enough to judge it again; plan's row agrees on the same peak.
    On the CPU (no reserve) that size fits, as before."""
    from shardbench.models.registry import get_workload
    from shardbench.records import CellKey
    from shardbench.studies.plan import PlanRow
    from shardbench.studies.plan_reserve import Reserve, policy

    base_peak = 16 * get_workload("transformer").param_count("base")
    budget = int(base_peak * 1.05)  # base fits alone; ddp's measured ratio (1.16) puts it over
    reserve = policy("cuda").of("ddp")
    assert reserve.ratio > 1.05 and not reserve.fits(base_peak, budget)

    lines: list[str] = []
    cpu = _reserve_search(tmp_path, monkeypatch, "cpu", budget, lines)
    assert cpu.max_size["largest_fit"]["preset"] == "base"
    assert not any("reserve" in line for line in lines)  # nothing kept beside a CPU peak
    assert cpu.max_size["reserve"]["counted"] is False and cpu.max_size["usable_bytes"] == budget

    lines.clear()
    cuda = _reserve_search(tmp_path, monkeypatch, "cuda", budget, lines)
    info = cuda.max_size
    fit, fail = info["largest_fit"], info["smallest_fail"]
    assert (fit["preset"], fail["preset"]) == ("small", "base")
    assert fail["status"] == "ok" and fail["peak_bytes"] == base_peak <= budget  # measured, refused
    assert fail["reserve_bytes"] == reserve.of(base_peak) and fit["reserve_bytes"] == reserve.of(
        fit["peak_bytes"]
    )
    # the lines say the reserve was counted and how much
    probe_line = next(line for line in lines if "transformer/base" in line)
    assert "does not fit - peak " in probe_line and " + reserve " in probe_line
    assert f"counting plan's reserve beside each peak ({reserve.basis})" in cuda.note
    assert "ddp's worst reserved/allocated ratio" in reserve.basis and "+ reserve" in cuda.note
    # the record keeps the budget and the reserve the decision used: judged again, the same answer
    assert info["budget_bytes"] == budget and info["usable_bytes"] == reserve.usable(budget)
    kept = Reserve(info["reserve"]["fixed_bytes"], info["reserve"]["ratio"])
    assert maxsize.kept_reserve(info) == kept == reserve
    probes = [r for r in read_records([tmp_path / "cuda"]) if r.suite == "max-size-probe"]
    for r in probes:
        peak = r.peak_mem_bytes["max"]
        # plan's row for the same peak and reserve says what the search said (one rule)
        verdict = PlanRow("ddp", r, budget, reserve=reserve).fits
        assert verdict == maxsize.probe_fits(r, budget, reserve) == kept.fits(peak, info["budget_bytes"])
        assert verdict == (r.preset in ("tiny", "small"))
    # a search by another fit rule is another cell when set against a baseline
    assert CellKey.of(cuda).preset.endswith("GiB-with-reserve") and CellKey.of(cpu).preset.endswith("GiB")


@pytest.mark.parametrize("reserve", [Reserve(), Reserve(fixed=1000), Reserve(fixed=7, ratio=1.1685)])
def test_max_size_and_plan_judge_a_peak_by_one_rule(reserve) -> None:
    """At the edge of a budget, byte by byte, a max-size probe and a plan row decide alike."""
    from shardbench.studies.plan import PlanRow
    from tests.records import make_record

    budget = 10_000_019
    edge = reserve.usable(budget)  # the largest peak that fits with its reserve
    for peak in (edge - 1, edge, edge + 1):
        record = make_record(peak_mem_bytes={"max": peak})
        fits = maxsize.probe_fits(record, budget, reserve)
        assert fits == PlanRow("ddp", record, budget, reserve=reserve).fits == (peak <= edge)


def test_the_cli_counts_the_reserve_on_a_cuda_target(tmp_path: Path, monkeypatch, capsys) -> None:
    """``max-size --device cuda`` (planned with --fake) counts plan's CUDA reserve and says so;
    ``--reserve`` replaces it, as in ``plan``, and is validated before anything runs."""
    import shardbench.report.build as build
    from shardbench.studies.plan_reserve import policy

    _stand_in_probes(monkeypatch, [])
    monkeypatch.setattr(build, "write_report", lambda out: out / "index.html")  # charts: not under test
    argv = ["max-size", "--workload", "transformer", "--strategy", "zero3", "--world-size", "8", "--fake"]
    argv += ["--device", "cuda", "--budget", "2GiB", "--ladder", "tiny,small"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    printed = capsys.readouterr().out
    assert policy("cuda").of("zero3").basis in printed.replace("\n  ", " ")
    (summary,) = [r for r in read_records([tmp_path / "a"]) if r.suite == "max-size"]
    assert summary.max_size["reserve"]["ratio"] == policy("cuda").worst  # zero3: never on a GPU
    assert main([*argv, "--reserve", "lots", "--out", str(tmp_path / "b")]) == 2
    assert "cannot read --reserve" in capsys.readouterr().err
    assert main([*argv, "--reserve", "2GiB", "--out", str(tmp_path / "b")]) == 2
    assert "leaves nothing of --budget" in capsys.readouterr().err and not (tmp_path / "b").exists()


def test_nothing_fits_names_the_smallest_size_searched_and_what_lies_below_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """When the search's smallest size does not fit, that is the smallest size it covers, not
    the smallest model: a named preset below it (transformer's tiny) may fit, and the answer
    says which and how to search it. Each search's answer is printed once."""
    monkeypatch.setattr(maxsize, "run_cell", lambda cell, *, run_id: stand_in_record(cell, run_id=run_id))
    argv = ["max-size", "--workload", "transformer", "--strategy", "ddp", "--world-size", "8"]
    argv += ["--ladder", "small,base", "--budget", "1MiB", "--out", str(tmp_path / "ms")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    (answer,) = [r.note for r in read_records([tmp_path / "ms"]) if r.suite == "max-size"]
    assert "nothing fits; small (" in answer and "is the smallest size the search covers" in answer
    assert "smallest that did not fit" not in answer
    assert "a smaller model may fit: tiny (" in answer and "(--ladder tiny,small)" in answer
    assert " ".join(out.split()).count(" ".join(answer.split())) == 1
