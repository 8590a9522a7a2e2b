"""The headline never contradicts the strategy-wide lines beneath it: a strategy judged faster
or slower over all its cells is named in the headline even where every cell alone is within its
noise, since a strategy's combined noise is smaller than any one cell's."""

from __future__ import annotations

from shardbench.records import Record
from shardbench.report.compare_report import summary_line, to_text
from shardbench.studies.compare import compare_runs
from tests.records import make_record

#: how each workload's zero2/ddp pair strays from the true ratio, per repeat (the same pattern on
#: both sides): small, so four cells together see a change that none sees alone
STRAY = {
    "transformer": (1.03, 0.97),
    "imagegpt": (0.975, 1.025),
    "swav": (1.025, 0.975),
    "lstm": (0.97, 1.03),
}


def _run(zero2: float, *, name: str, runs: int = 1) -> list[Record]:
    """ddp at 100 ms and zero2 at ``zero2`` times it, in each of four workloads, two repeats a run."""
    out = []
    for r in range(runs):
        for workload, pattern in STRAY.items():
            for repeat, stray in enumerate(pattern if r % 2 == 0 else pattern[::-1]):
                for strategy, ms in (("ddp", 100.0), ("zero2", 100.0 * stray * zero2)):
                    out.append(
                        make_record(
                            run_id=f"{name}{r}",
                            repeat=repeat,
                            workload=workload,
                            strategy=strategy,
                            steps=20,
                            step_time_s={"median": ms / 1e3, "mad": 1e-3, "n": 20},
                            env={"torch": "2.11.0", "device_name": "x86_64"},
                        )
                    )
    return out


def test_a_strategy_faster_over_its_cells_is_in_the_headline_though_no_cell_is() -> None:
    base = _run(1.0, name="b", runs=3)
    faster = compare_runs(base, _run(0.88, name="c"))
    assert {c.verdict for c in faster.cells} == {"unchanged"}  # every cell within its noise
    (zero2,) = faster.strategies
    assert zero2.verdict == "improved"
    headline = summary_line(faster)
    assert "(8 unchanged, each judged alone)" in headline
    assert f"strategy-wide vs ddp: zero2 improved {zero2.change_pct:+.1f}% over 4 cells" in headline
    assert f"(beyond its {zero2.band_text} band)" in headline
    text = to_text(faster)
    assert text.splitlines()[0] == headline
    assert "strategy-wide step time vs ddp: improved: zero2 on cpu" in text  # the line it agrees with


def test_a_headline_of_unmoved_strategies_names_none() -> None:
    same = compare_runs(_run(1.0, name="b", runs=3), _run(1.0, name="c"))
    assert [s.verdict for s in same.strategies] == ["unchanged"]
    assert summary_line(same) == "no regression in 8 cells compared (8 unchanged); rules: defaults"
