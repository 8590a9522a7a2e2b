"""The step-time gate on synthetic records: ratios to ddp within a run by default, absolute time
only on a dedicated runner with three repeats a side, and the headline that counts regressions."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from shardbench.records import Record, read_records
from shardbench.report.compare_report import summary_line, to_text
from shardbench.studies.compare import compare_runs
from shardbench.studies.compare_rules import Rules, load_rules
from shardbench.studies.compare_strategy import CellChange, strategy_deltas
from shardbench.studies.machines import machine_of, machines
from shardbench.studies.speed_verdict import NOT_JUDGED, ONE_RUN, speed_verdicts
from tests.records import make_record

GIB = 1 << 30
REPO = Path(__file__).resolve().parents[1]


def rec(strategy: str, ms: float, *, run: str = "r", repeat: int = 0, mad_ms: float = 1.0, **over) -> Record:
    """An ok CPU record of the tiny transformer at N=2: ``ms`` median step time over 20 steps."""
    fields: dict = dict(
        run_id=run,
        strategy=strategy,
        repeat=repeat,
        steps=20,
        peak_mem_bytes={"max": GIB, "per_rank": [GIB, GIB]},
        model_state_bytes={"total": GIB // 2},
        step_time_s={"median": ms / 1e3, "mad": mad_ms / 1e3, "n": 20},
        env={"torch": "2.11.0", "device_name": "x86_64"},
    )
    return make_record(**{**fields, **over})


def run(times: dict[str, list[float]], *, name: str = "r", **over) -> list[Record]:
    """One run: each strategy's step times, one per repeat."""
    return [rec(s, ms, run=name, repeat=i, **over) for s, ts in times.items() for i, ms in enumerate(ts)]


def cell(comparison, strategy: str):
    (found,) = [c for c in comparison.cells if c.identity["strategy"] == strategy]
    return found


def metric(c, name: str):
    return next((m for m in c.metrics if m.metric == name), None)


BASE = {"ddp": [100, 100], "zero2": [120, 120]}


def test_a_drifting_machine_is_not_a_regression() -> None:
    """The same code on a machine 80% slower: absolute time is reported, marked, not gated; the
    ratio to ddp in the same run did not move."""
    slow = compare_runs(run(BASE, name="b"), run({"ddp": [180, 180], "zero2": [216, 216]}))
    assert slow.exit_code == 0
    ddp, zero2 = cell(slow, "ddp"), cell(slow, "zero2")
    assert metric(ddp, "step_time_s").verdict == "not gated"
    assert metric(ddp, "step_time_s").change_pct == pytest.approx(80)
    assert "not gated (shared runner)" in metric(ddp, "step_time_s").note
    assert "reference of its group" in metric(ddp, "step_time_s").note
    assert metric(ddp, "step_time_vs_ddp") is None  # ddp against itself says nothing
    ratio = metric(zero2, "step_time_vs_ddp")
    assert ratio.verdict == "unchanged" and ratio.baseline == pytest.approx(1.2)
    assert ratio.current == pytest.approx(1.2)
    assert "its ratio to ddp is gated" in metric(zero2, "step_time_s").note
    assert "time itself is reported, not gated (shared runner)" in to_text(slow)


def test_one_strategy_slower_regresses_its_ratio() -> None:
    """zero2 30% slower while ddp is not: its ratio 1.2 -> 1.56 is named and exits 1."""
    slower = compare_runs(run(BASE, name="b"), run({"ddp": [100, 100], "zero2": [156, 156]}))
    assert slower.exit_code == 1 and [c.identity["strategy"] for c in slower.regressions] == ["zero2"]
    ratio = metric(cell(slower, "zero2"), "step_time_vs_ddp")
    assert ratio.verdict == "regressed" and ratio.current == pytest.approx(1.56)
    text = to_text(slower)
    assert "step_time_vs_ddp" in text and "1.200x" in text and "1.560x" in text and "+30.0%" in text
    # under the relative threshold (CPU 15%) it is unchanged even with no noise at all
    quiet = dict(mad_ms=0.0)
    small = compare_runs(run(BASE, name="b", **quiet), run({"ddp": [100, 100], "zero2": [132, 132]}, **quiet))
    assert metric(cell(small, "zero2"), "step_time_vs_ddp").verdict == "unchanged"
    faster = compare_runs(run(BASE, name="b"), run({"ddp": [100, 100], "zero2": [80, 80]}))
    assert cell(faster, "zero2").verdict == "improved" and faster.exit_code == 0


def test_memory_is_gated_on_a_shared_runner() -> None:
    bigger = {"max": int(GIB * 1.1)}
    grown = run({"ddp": [180, 180]}) + run({"zero2": [216, 216]}, peak_mem_bytes=bigger)
    c = compare_runs(run(BASE, name="b"), grown)
    assert c.exit_code == 1 and metric(cell(c, "zero2"), "peak_mem_bytes").verdict == "regressed"
    assert metric(cell(c, "zero2"), "step_time_vs_ddp").verdict == "unchanged"


def test_ratios_pair_by_run_and_repeat() -> None:
    """A baseline of a fast run and a slow one: paired within each run the ratio is 1.2 in both,
    so their spread is no noise; a pair whose ddp is missing is left out."""
    fast, slow = {"ddp": [60, 60], "zero2": [72, 72]}, {"ddp": [90, 90], "zero2": [108, 108]}
    base = run(fast, name="a") + run(slow, name="b")
    night = run({"ddp": [100, 100], "zero2": [120, 120, 150]}, name="n")
    ratio = metric(cell(compare_runs(base, night), "zero2"), "step_time_vs_ddp")
    assert ratio.baseline == pytest.approx(1.2) and ratio.current == pytest.approx(1.2)
    assert "4 pairs with ddp in the baseline, 2 now" in ratio.note
    assert "relative threshold" in ratio.note  # no spread: the 15% decides


def test_a_ratio_of_one_pair_is_not_judged_and_cannot_fail_the_gate() -> None:
    """A smoke run (one run, no repeats) against a baseline of two runs of two repeats: zero2's
    ratio moved 1.11x -> 2.00x, which one pair cannot tell from drift between its two cells.
    ``run`` says "one run: not judged" of that ratio; ``compare`` says the same and exits 0, the
    strategy-wide test leaves it out, and only memory can still fail it."""
    base = run({"ddp": [100, 100], "zero2": [111.4, 111.4]}, name="a")
    base += run({"ddp": [100, 100], "zero2": [111.4, 111.4]}, name="b")
    smoke = run({"ddp": [100], "zero2": [199.8]}, name="smoke")
    c = compare_runs(base, smoke)
    ratio = metric(cell(c, "zero2"), "step_time_vs_ddp")
    assert (ratio.baseline, ratio.current) == (pytest.approx(1.114), pytest.approx(1.998))
    assert ratio.verdict == "not judged" and ratio.low is None and ratio.error is None
    assert ratio.note.startswith("not judged: one run now (1 pair with ddp")
    assert c.exit_code == 0 and not c.strategies and cell(c, "zero2").verdict == "unchanged"
    assert "1 ratio not judged, which cannot fail the gate" in to_text(c)
    (verdict,) = [v for k, v in speed_verdicts(smoke).items() if k.strategy == "zero2"]
    assert verdict.word == NOT_JUDGED and verdict.reason == ONE_RUN  # what `run` printed
    # a baseline of one pair is as blind, whatever the night
    night = run({"ddp": [100, 100], "zero2": [199.8, 199.8]}, name="n")
    backwards = metric(cell(compare_runs(smoke, night), "zero2"), "step_time_vs_ddp")
    assert backwards.verdict == "not judged" and "one run the baseline" in backwards.note
    # memory still fails it
    grown = [replace(r, peak_mem_bytes={"max": 2 * GIB}) if r.strategy == "zero2" else r for r in smoke]
    assert compare_runs(base, grown).exit_code == 1
    # two pairs a side judge the same move
    assert compare_runs(base, night).exit_code == 1


def test_a_crowded_cells_ratio_is_not_judged_by_compare_as_by_run() -> None:
    """Ranks that outnumbered the cores they ran on waited for their turn: ``run`` never judges
    that step time, and neither does ``compare``, with repeats or without."""
    crowded = dict(placement={"ranks": 8, "cores": 2})
    base = run({"ddp": [100, 100], "zero2": [110, 110]}, name="b", **crowded)
    night = run({"ddp": [100, 100], "zero2": [220, 220]}, name="n", **crowded)
    c = compare_runs(base, night)
    ratio = metric(cell(c, "zero2"), "step_time_vs_ddp")
    assert ratio.verdict == "not judged" and "more ranks than cores" in ratio.note and c.exit_code == 0
    (verdict,) = [v for k, v in speed_verdicts(night).items() if k.strategy == "zero2"]
    assert verdict.word == NOT_JUDGED and verdict.reason == "more ranks than cores"


def test_the_ratio_band_widens_with_the_pairs_spread() -> None:
    """Pairs that disagree (the ratio 1.0 in one repeat, 1.4 in the next) say the ratio is noisy:
    +30% is then within the noise; the same +30% with pairs that agree is not."""
    spread = run({"ddp": [100, 100, 100, 100], "zero2": [100, 140, 100, 140]}, name="b")
    now = run({"ddp": [100, 100], "zero2": [156, 156]})
    noisy = metric(cell(compare_runs(spread, now), "zero2"), "step_time_vs_ddp")
    assert noisy.verdict == "unchanged" and "combined standard error" in noisy.note
    steady = run({"ddp": [100, 100, 100, 100], "zero2": [120, 120, 120, 120]}, name="b")
    assert metric(cell(compare_runs(steady, now), "zero2"), "step_time_vs_ddp").verdict == "regressed"
    # runs that disagree as a whole (each run's pairs agree; one run 1.0, the next 1.4) too
    runs = run({"ddp": [100, 100], "zero2": [100, 100]}, name="a")
    runs += run({"ddp": [100, 100], "zero2": [140, 140]}, name="b")
    by_run = metric(cell(compare_runs(runs, now), "zero2"), "step_time_vs_ddp")
    assert by_run.verdict == "unchanged"
    # noisy steps (the MAD of each step time) widen it too
    loud = dict(mad_ms=40.0)
    loud_now = run({"ddp": [100, 100], "zero2": [156, 156]}, **loud)
    wide = compare_runs(run(BASE, name="b", **loud), loud_now)
    assert metric(cell(wide, "zero2"), "step_time_vs_ddp").verdict == "unchanged"


def test_pairs_that_disagree_anywhere_widen_every_band() -> None:
    """The pairs' spread is the machine's: zero2's pairs that agree by chance are no more certain
    than zero1's, which disagree in both runs; a night whose own pairs disagree is not out-voted
    by a quiet baseline."""
    base = run({"ddp": [100, 100], "zero2": [120, 120], "zero1": [100, 100]}, name="b")
    quiet = run({"ddp": [100, 100], "zero2": [156, 156], "zero1": [100, 100]})
    assert metric(cell(compare_runs(base, quiet), "zero2"), "step_time_vs_ddp").verdict == "regressed"
    loud_base = run({"ddp": [100, 100], "zero2": [120, 120], "zero1": [60, 140]}, name="b")
    loud = run({"ddp": [100, 100], "zero2": [156, 156], "zero1": [60, 140]})
    assert metric(cell(compare_runs(loud_base, loud), "zero2"), "step_time_vs_ddp").verdict == "unchanged"
    own = run({"ddp": [100, 100], "zero2": [90, 260], "zero1": [100, 100]})
    assert metric(cell(compare_runs(base, own), "zero2"), "step_time_vs_ddp").verdict == "unchanged"


def test_a_dedicated_runner_gates_absolute_time_with_three_repeats_a_side() -> None:
    dedicated = Rules(dedicated=True)
    base = run({"ddp": [100, 100, 100]}, name="b")
    two = compare_runs(base, run({"ddp": [180, 180]}), dedicated)
    time = metric(cell(two, "ddp"), "step_time_s")
    assert time.verdict == "not gated" and two.exit_code == 0
    assert "3 timed repeats in the baseline, 2 now; absolute time needs 3 on each side" in time.note
    three = compare_runs(base, run({"ddp": [180, 180, 180]}), dedicated)
    assert metric(cell(three, "ddp"), "step_time_s").verdict == "regressed" and three.exit_code == 1
    assert "and as time itself (dedicated runner" in to_text(three)


def test_no_ddp_in_the_group_means_no_time_gate() -> None:
    """zero2 alone, or beside a ddp of another batch (another group): nothing to divide by."""
    other_batch = [rec("ddp", 100, batch_size_per_rank=16), rec("zero2", 120)]
    c = compare_runs(other_batch, [rec("ddp", 100, batch_size_per_rank=16), rec("zero2", 300)])
    zero2 = cell(c, "zero2")
    assert metric(zero2, "step_time_vs_ddp") is None and c.exit_code == 0
    assert "no ddp of its group on both sides" in metric(zero2, "step_time_s").note


def test_the_headline_counts_regressions_only() -> None:
    c = compare_runs(run(BASE, name="b"), run({"ddp": [100, 100], "zero2": [156, 156]}))
    assert summary_line(c).startswith("REGRESSION in 1 of 2 cells compared (1 regressed, 1 unchanged);")
    same = compare_runs(run(BASE, name="b"), run(BASE))
    assert summary_line(same).startswith("no regression in 2 cells compared (2 unchanged);")
    failing = compare_runs(run(BASE, name="b"), [rec("ddp", 100), rec("zero2", 120, status="oom")])
    assert summary_line(failing).startswith("REGRESSION in 1 of 2 cells compared (1 now failing, 1 unch")


def test_rules_declare_a_dedicated_runner(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text("[time]\ndedicated = true\nmin_repeats = 4\n")
    rules = load_rules(path)
    assert rules.dedicated and rules.min_repeats == 4
    path.write_text("[time]\ndedicated = 1\n")
    with pytest.raises(ValueError, match="dedicated must be true or false, got 1"):
        load_rules(path)
    gpu = load_rules(REPO / "bench" / "suites" / "rules" / "nightly-gpu.toml")
    assert gpu.dedicated and gpu.min_repeats == 3
    assert not load_rules(REPO / "bench" / "suites" / "rules" / "nightly-cpu-hosted.toml").dedicated


def test_the_committed_cpu_baseline_has_ratios_to_gate() -> None:
    """The saved nightly-cpu baseline is usable as it is, on each machine it holds: every timed
    non-ddp cell gets a ratio from that machine's records alone."""
    saved = read_records([REPO / "results" / "baselines" / "cpu" / "nightly-cpu.jsonl"])
    assert len(machines(saved)) >= 2  # the processors CI machines come with
    for machine in machines(saved):  # each machine's records against the whole baseline
        records = [r for r in saved if machine_of(r) == machine]
        c = compare_runs(saved, records)
        assert c.exit_code == 0
        timed = [x for x in c.cells if not x.identity["simulated"] and x.identity["strategy"] != "ddp"]
        assert timed and all(metric(x, "step_time_vs_ddp").verdict == "unchanged" for x in timed)
        assert all("6 pairs with ddp" in metric(x, "step_time_vs_ddp").note for x in timed)


def _suite(slower: float, *, name: str, runs: int = 1, scale: float = 1.0) -> list[Record]:
    """Four workloads, ddp and zero2, two repeats a run: zero2's ratio strays +-12% (x ``scale``)
    from pair to pair (a fixed pattern, the same on both sides), times ``slower``."""
    stray = {
        "transformer": (1.12, 0.88),
        "imagegpt": (0.9, 1.1),
        "swav": (1.1, 0.9),
        "deepspeech2": (0.88, 1.12),
    }
    stray = {w: (1 + scale * (a - 1), 1 + scale * (b - 1)) for w, (a, b) in stray.items()}
    out = []
    for r in range(runs):
        for workload, (a, b) in stray.items():
            for repeat, f in enumerate((a, b) if r % 2 == 0 else (b, a)):
                kw = dict(run=f"{name}{r}", repeat=repeat, workload=workload)
                out += [rec("ddp", 100, **kw), rec("zero2", 100 * f * slower, **kw)]
    return out


def test_a_slowdown_in_every_workload_regresses_the_strategy_though_no_cell_does(tmp_path: Path) -> None:
    """Each cell's ratio is judged alone within its own noise; a strategy's ratio is also judged
    over all its cells at once, where the noise averages out and a slowdown in every cell does
    not."""
    base = _suite(1.0, name="b", runs=3)
    same = compare_runs(base, _suite(1.0, name="c"))
    assert same.exit_code == 0 and [s.verdict for s in same.strategies] == ["unchanged"]
    slow = compare_runs(base, _suite(1.3, name="c"))
    assert not slow.regressions  # no cell alone
    (zero2,) = slow.strategies
    assert zero2.regressed and zero2.change_pct == pytest.approx(30.0) and len(zero2.cells) == 4
    assert slow.exit_code == 1
    assert summary_line(slow).startswith("REGRESSION: zero2's step time vs ddp over all its cells")
    assert "zero2 on cpu: +30.0% over 4 cells" in to_text(slow)
    rules = tmp_path / "rules.toml"
    rules.write_text(
        '[[ignore]]\nstrategy = "zero2"\nworkload = "swav"\nmetrics = ["step_time_vs_ddp"]\nreason = "r"\n'
    )
    (ignored_swav,) = compare_runs(base, _suite(1.3, name="c"), load_rules(rules)).strategies
    assert len(ignored_swav.cells) == 3


def test_a_strategy_is_judged_by_its_own_threshold_below_a_cells(tmp_path: Path) -> None:
    """A 14 % slowdown of one strategy in every workload is below a cell's threshold (CPU 15 %),
    so no cell's own test can call it; the strategy-wide test's threshold (CPU 5 %) lets its
    noise band decide, which here is narrow enough. With the strategy threshold raised to 15 %
    in a rules file, the same night passes."""
    base = _suite(1.0, name="b", runs=3, scale=0.25)
    assert compare_runs(base, _suite(1.0, name="c", scale=0.25)).exit_code == 0
    slow = compare_runs(base, _suite(1.14, name="c", scale=0.25))
    (zero2,) = slow.strategies
    assert zero2.regressed and zero2.threshold_pct == 5.0 and zero2.bound_pct < 14.0
    assert slow.exit_code == 1 and not slow.regressions
    rules = tmp_path / "rules.toml"
    rules.write_text("[time]\ncpu_strategy_pct = 15\n")
    (lenient,) = compare_runs(base, _suite(1.14, name="c", scale=0.25), load_rules(rules)).strategies
    assert lenient.threshold_pct == 15.0 and not lenient.regressed
    rules.write_text("[time]\ncpu_strategy_pct = -1\n")
    with pytest.raises(ValueError, match="cpu_strategy_pct must be a non-negative number"):
        load_rules(rules)


@pytest.mark.parametrize(
    ("error", "bound"),
    [(0.04, 0.06), (0.01, math.log(1.05))],  # the noise decides; the threshold does
)
def test_the_least_detectable_slowdown_is_the_band_plus_z_errors(error: float, bound: float) -> None:
    """Four cells, each with a log-change error of ``error``: the combined error is their root
    sum of squares over 4, the band the larger of 3 x it and ln(1.05), and the least slowdown
    caught in 4 nights of 5 is exp(band + z(0.8) x error) - 1, z(0.8) = 0.8416212335729143."""
    cells = [
        CellChange("zero2", "cpu", f"w{i}", log_change=0.0, error=error, pct=5.0, k=3.0) for i in range(4)
    ]
    (delta,) = strategy_deltas(cells)
    combined = math.sqrt(4 * error**2) / 4
    assert delta.bound_pct == pytest.approx(100 * math.expm1(bound), rel=1e-12)
    assert delta.detectable_pct == pytest.approx(
        100 * math.expm1(bound + 0.8416212335729143 * combined), rel=1e-12
    )
    assert f"could detect >= {delta.detectable_pct:.1f}% (80% of nights)" in delta.describe()
    assert delta.verdict == "unchanged"
    cells = [replace(c, log_change=math.log(1.2)) for c in cells]
    (slower,) = strategy_deltas(cells)
    assert slower.change_pct == pytest.approx(20.0) and slower.regressed
    assert slower.detectable_pct == delta.detectable_pct  # what a night can see is not its change


def test_the_verdict_says_what_each_strategy_could_have_detected() -> None:
    c = compare_runs(_suite(1.0, name="b", runs=3, scale=0.25), _suite(1.0, name="c", scale=0.25))
    (zero2,) = c.strategies
    line = f"zero2 +0.0% (could detect >= {zero2.detectable_pct:.1f}%)"
    assert c.exit_code == 0 and line in to_text(c)
    assert "least slowdown caught in 80% of nights" in to_text(c)


def test_a_run_that_moves_every_cell_of_a_strategy_widens_its_band() -> None:
    """Runs of the baseline whose cells all stray the same way (+5 %, -5 %, 0: a mode of the
    whole run) do not average out over the cells: the combined error is their standard
    deviation, 0.05, times hypot(1/sqrt(3 runs), 1/sqrt(1 run)), not the cells' own errors over
    4. Cells that stray against each other in every run average out, and their own errors
    decide."""
    together = {"a": 0.05, "b": -0.05, "c": 0.0}
    cells = [
        CellChange(
            "zero2", "cpu", f"w{i}", 0.0, error=0.005, pct=5.0, k=3.0, base_runs=together, cur_runs={"n": 0.0}
        )
        for i in range(4)
    ]
    (delta,) = strategy_deltas(cells)
    error = 0.05 * math.hypot(1 / math.sqrt(3), 1.0)
    assert delta.noise_pct == pytest.approx(100 * math.expm1(3 * error), rel=1e-12)
    against = [{r: (x if i % 2 else -x) for r, x in together.items()} for i in range(4)]
    cells = [replace(c, base_runs=runs) for c, runs in zip(cells, against, strict=True)]
    (alone,) = strategy_deltas(cells)
    assert alone.noise_pct == pytest.approx(100 * math.expm1(3 * math.sqrt(4 * 0.005**2) / 4), rel=1e-12)


def test_a_night_noisier_than_its_baseline_widens_its_own_band() -> None:
    """The strategy-wide error takes each side's pair spread from that side's cells: a night
    whose pairs stray +-36 % against a baseline's +-3 % does not borrow the baseline's quiet, so
    a 14 % slowdown that a quiet night catches is within this one's noise, and the night says
    how much larger a slowdown it would have needed."""
    base = _suite(1.0, name="b", runs=3, scale=0.25)
    (quiet,) = compare_runs(base, _suite(1.14, name="c", scale=0.25)).strategies
    (noisy,) = compare_runs(base, _suite(1.14, name="c", scale=3.0)).strategies
    assert quiet.regressed and not noisy.regressed
    assert noisy.detectable_pct > 2 * quiet.detectable_pct
