"""Scaling efficiency (bench/studies/scaling.py): its arithmetic, which N = 1 cell a record is
set against and which it is not, its noise verdict, and the suite option that measures it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardbench.records import Record
from shardbench.studies.scaling import (
    AT_ONE,
    NO_REFERENCE,
    NO_REFERENCE_REPEAT,
    SIMULATED,
    cell_scaling,
    record_scaling,
)
from tests.records import make_record


def _timed(
    strategy: str, n: int, ms: float, *, batch: int = 8, repeat: int = 0, mad: float = 0.1, **kw
) -> Record:
    """A real cell at world size ``n`` of ``ms`` median step time and 20 timed steps."""
    return make_record(
        strategy=strategy,
        world_size=n,
        requested_world_size=n,
        repeat=repeat,
        steps=20,
        batch_size_per_rank=batch,
        step_time_s={"median": ms / 1e3, "mad": mad / 1e3, "n": 20},
        samples_per_s=batch * n / (ms / 1e3),
        **kw,
    )


def test_efficiency_is_per_rank_samples_over_the_n1_cells_exactly() -> None:
    ref = _timed("ddp", 1, 100.0, threads_per_rank=2)
    ddp2, zero2 = _timed("ddp", 2, 125.0, threads_per_rank=1), _timed("zero2", 2, 160.0, threads_per_rank=1)
    out = record_scaling([ref, ddp2, zero2])
    # (8 * 2 / 0.125 / 2) / (8 / 0.1) = 0.8; (8 * 2 / 0.160 / 2) / 80 = 0.625
    assert out[id(ddp2)].efficiency == pytest.approx(0.8, rel=1e-12)
    assert out[id(zero2)].efficiency == pytest.approx(0.625, rel=1e-12)
    assert out[id(ref)].efficiency is None and out[id(ref)].why == AT_ONE
    # each rank had one core of the two the N=1 cell had to itself: said beside the figure
    assert out[id(zero2)].text() == "0.62 (N=1 had 2 threads, each of N=2's ranks 1)"


def test_which_n1_cell_pairs_and_which_does_not() -> None:
    """The reference is ddp at N=1 whatever the strategy, of the same workload, preset,
    precision, batch, flags, run and repeat; anything else is not its N=1 cell."""
    ref = _timed("ddp", 1, 100.0)
    zero2 = _timed("zero2", 2, 125.0)
    assert record_scaling([ref, zero2])[id(zero2)].efficiency == pytest.approx(0.8)
    unpaired = {
        "zero2 at N=1 is not the reference": [_timed("zero2", 1, 100.0), zero2],
        "another run": [replace(ref, run_id="other"), zero2],
        "another batch": [_timed("ddp", 1, 100.0, batch=4), zero2],
        "another preset": [replace(ref, preset="small"), zero2],
        "another precision": [replace(ref, precision="bf16"), zero2],
        "activation checkpointing": [replace(ref, activation_checkpointing=True), zero2],
        "a simulated N=1": [replace(ref, simulated=True, backend="fake"), zero2],
    }
    for why, records in unpaired.items():
        assert record_scaling(records)[id(zero2)].efficiency is None, why
        assert record_scaling(records)[id(zero2)].why == NO_REFERENCE, why
        assert not cell_scaling(records), why
    # the same run, another repeat: paired repeat by repeat only
    other_repeat = record_scaling([replace(ref, repeat=1), zero2])[id(zero2)]
    assert other_repeat.efficiency is None and other_repeat.why == NO_REFERENCE_REPEAT
    assert other_repeat.text() == f"none: {NO_REFERENCE_REPEAT}"
    simulated = replace(zero2, simulated=True, backend="fake", samples_per_s=None)
    assert record_scaling([ref, simulated])[id(simulated)].why == SIMULATED
    failed = replace(ref, status="oom", step_time_s=None, samples_per_s=None)
    assert record_scaling([failed, zero2])[id(zero2)].why == "its N=1 cell oom"


def test_a_cells_efficiency_over_repeats_and_its_noise_verdict() -> None:
    """The median of the pairs'; below ideal only beyond the spread between repeats, one run
    never judged, more ranks than cores never judged and flagged."""
    rounds = [
        r
        for i, (one, two) in enumerate([(100.0, 200.0), (110.0, 210.0), (90.0, 195.0)])
        for r in (_timed("ddp", 1, one, repeat=i), _timed("zero2", 2, two, repeat=i))
    ]
    (cell,) = cell_scaling(rounds).values()
    assert cell.pairs == 3 and cell.efficiency == pytest.approx(100 / 200)  # pairs 0.5, 0.524, 0.462
    assert cell.word == "below ideal" and cell.text() == "0.50 (3 repeats: below ideal)"
    (one_run,) = cell_scaling(rounds[:2]).values()
    assert one_run.word == "not judged" and one_run.text() == "0.50 (one run: not judged)"
    same = [_timed("ddp", 1, 100.0, repeat=i) for i in range(3)] + [
        _timed("ddp", 2, 100.0, repeat=i) for i in range(3)
    ]
    (ideal,) = cell_scaling(same).values()
    assert ideal.efficiency == 1.0 and ideal.word == "within noise of ideal"
    crowded = [replace(r, placement={"ranks": 2, "cores": 1}) if r.world_size == 2 else r for r in rounds]
    (flagged,) = cell_scaling(crowded).values()
    assert flagged.word == "not judged" and flagged.flags == ("more ranks than cores",)
    assert flagged.text() == "0.50 (more ranks than cores: not judged)"
    assert record_scaling(crowded)[id(crowded[1])].text() == "0.50 (more ranks than cores)"
    # each rank on a share of the cores the N=1 cell had whole: the verdict would be a thread's
    shared = [replace(r, threads_per_rank=2 if r.world_size == 1 else 1) for r in rounds]
    (threads,) = cell_scaling(shared).values()
    assert cell.word == "below ideal" and threads.word == "not judged"
    assert threads.text() == "0.50 (not judged: N=1 had 2 threads, each of N=2's ranks 1)"


def test_a_suite_that_asks_for_scaling_adds_the_n1_cells_in_the_same_rounds(tmp_path) -> None:
    from shardbench.cli import UsageError, build_parser, resolve_cells
    from shardbench.harness.config import load_suite
    from shardbench.harness.runner import interleave_repeats

    suite = tmp_path / "scaled.toml"
    suite.write_text(
        'workloads = ["transformer"]\nstrategies = ["ddp", "zero2"]\nworld_sizes = [2, 4]\n'
        "repeat = 2\nscaling = true\n"
        "[[matrix]]\n\n[[matrix]]\nworld_sizes = [8]\nsimulate = true\nrepeat = 1\n"
    )
    cells = load_suite(str(suite)).cells()
    assert sorted((c.strategy, c.world_size, c.repeat) for c in cells if c.world_size == 1) == [
        ("ddp", 1, 0),
        ("ddp", 1, 1),
    ]  # one N=1 cell for every strategy and N, repeated as they are; none for the simulated N=8
    order = [(c.strategy, c.world_size, c.repeat) for c in interleave_repeats(cells)]
    assert order == [
        ("ddp", 1, 0), ("ddp", 2, 0), ("ddp", 4, 0), ("zero2", 2, 0), ("zero2", 4, 0),
        ("ddp", 1, 1), ("ddp", 2, 1), ("ddp", 4, 1), ("zero2", 2, 1), ("zero2", 4, 1),
        ("ddp", 8, 0), ("zero2", 8, 0),
    ]  # fmt: skip
    # without it, no N=1 cell, and each world size is a group of its own
    unscaled = [c for c in cells if c.world_size != 1]
    assert [(c.world_size, c.repeat) for c in interleave_repeats(unscaled)][:4] == [
        (2, 0),
        (2, 0),
        (2, 1),
        (2, 1),
    ]
    args = ["run", "--workload", "transformer", "--strategy", "zero2", "--world-size", "2"]
    _, flagged = resolve_cells(build_parser().parse_args([*args, "--scaling"]))
    assert [(c.strategy, c.world_size) for c in flagged] == [("ddp", 1), ("zero2", 2)]
    _, plain = resolve_cells(build_parser().parse_args(args))
    assert [(c.strategy, c.world_size) for c in plain] == [("zero2", 2)]
    with pytest.raises(
        UsageError, match=r"^--scaling: no real cell at N > 1 .* without --simulate or --fake$"
    ):
        resolve_cells(build_parser().parse_args([*args, "--scaling", "--simulate"]))
    with pytest.raises(UsageError, match=r"^--scaling: no real cell at N > 1"):
        resolve_cells(build_parser().parse_args([*args[:-1], "1", "--scaling"]))


def test_tables_terminal_export_and_report_show_it_or_say_why_not() -> None:
    from shardbench.report.scaling_html import scaling_table
    from shardbench.report.tables import records_to_frame
    from shardbench.report.terminal import terminal_table
    from shardbench.studies.export import to_pytest_benchmark

    times = {"step_times_s": [0.1] * 20}
    ref, zero2 = _timed("ddp", 1, 100.0, **times), _timed("zero2", 2, 125.0, **times)
    lone = _timed("zero2", 2, 125.0, batch=4, **times)  # no N=1 cell at batch 4 in the run
    records = [ref, zero2, lone]
    frame = records_to_frame(records).set_index(["world_size", "batch_per_rank"])
    assert frame.loc[(2, 8), "scaling_efficiency"] == pytest.approx(0.8)
    assert frame.loc[(2, 4), "scaling_note"] == NO_REFERENCE
    assert frame.loc[(2, 4), "scaling_efficiency"] != frame.loc[(2, 4), "scaling_efficiency"]  # NaN, not 0
    assert "scaling_efficiency" not in records_to_frame([zero2, lone]).columns  # nothing asked for it
    text = terminal_table(records)
    assert (
        "transformer tiny fp32 b=8 scaling efficiency (per-rank samples/s over ddp N=1): "
        "zero2 N=2 0.80 (one run: not judged)" in text.replace("\n  ", " ")
    )
    assert f"zero2 N=2 none: {NO_REFERENCE}" in text.replace("\n  ", " ")
    exported = {b["name"]: b["extra_info"] for b in to_pytest_benchmark(records)["benchmarks"]}
    assert exported["transformer/tiny/zero2/n2/fp32/b8"]["scaling_efficiency"]["efficiency"] == pytest.approx(
        0.8
    )
    assert exported["transformer/tiny/zero2/n2/fp32/b4"]["scaling_efficiency"]["why"] == NO_REFERENCE
    page = scaling_table(records)
    assert "0.80 (one run: not judged)" in page and f"none: {NO_REFERENCE}" in page
    assert scaling_table([zero2, lone]) == ""


def test_the_throughput_chart_draws_ideal_scaling_from_the_n1_cell_and_mfu_per_strategy() -> None:
    from shardbench.report.chart_data import mfu_charts, throughput_scaling_charts
    from shardbench.report.chart_drawing import draw

    rounds = [
        _timed("ddp", 1, 100.0, repeat=i, mfu=0.2)
        for i, _ in enumerate("ab")  # two repeats of N=1: 80 samples/s each
    ] + [
        _timed("zero2", 2, 125.0, mfu=0.16),  # 128 samples/s
        _timed("zero2", 4, 200.0, mfu=0.1),  # 160 samples/s
        _timed("ddp", 2, 100.0, repeat=0, mfu=0.2),
        _timed("ddp", 2, 120.0, repeat=1, mfu=0.18),  # median of 160 and 133.3
        replace(_timed("zero2", 2, 125.0, mfu=0.5), simulated=True, backend="fake"),  # left out
    ]
    (chart,) = throughput_scaling_charts(rounds)
    lines = {line.series: line for line in chart.panels[0].lines}
    assert lines["ideal"].dashed and lines["ideal"].x == (1, 2, 4)
    assert lines["ideal"].y == pytest.approx((80.0, 160.0, 320.0))
    assert lines["zero2"].x == (1, 2, 4) and lines["zero2"].y == pytest.approx((80.0, 128.0, 160.0))
    assert lines["ddp"].x == (1, 2) and lines["ddp"].y == pytest.approx((80.0, (160.0 + 16 / 0.12) / 2))
    assert not throughput_scaling_charts([r for r in rounds if r.world_size > 1])  # no N=1 cell: no chart
    (mfu,) = mfu_charts(rounds)
    bars = [(b.series, b.value) for b in mfu.panels[0].bars]
    assert sorted(v for _, v in bars) == pytest.approx(sorted([20.0, 20.0, 16.0, 10.0, 20.0, 18.0]))
    assert "1 simulated or fake cell left out" in " ".join(mfu.notes)
    assert not mfu_charts([replace(r, mfu=None) for r in rounds])
    draw(chart)  # the line chart draws with its dashed ideal
