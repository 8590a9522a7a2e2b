"""What the README and the docs say of the gate's rules, held to what the gate does: the
README's memory and bytes tolerances are read from its text and applied to records, and the
number of timed steps the docs name is the one the verdicts use."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shardbench.records import Record
from shardbench.studies.compare import compare_runs
from shardbench.studies.compare_rules import Thresholds
from shardbench.studies.speed_verdict import pair_verdict
from tests.records import make_record

ROOT = Path(__file__).resolve().parents[1]
KIB, MIB = 1 << 10, 1 << 20
MEMORY_RULE = (
    r"grows by more than max\(([\d.]+) %, a floor, the spread between the baseline's repeats\): the "
    r"floor is (\d+) KiB on the CPU for a strategy whose memory repeats to the byte, (\d+) MiB elsewhere"
)


def _section(path: Path, heading: str) -> str:
    """The text under ``heading`` up to the next heading of its level, on one line."""
    text = path.read_text()
    level = heading.split(" ")[0]
    start = text.index(heading)
    end = text.find(f"\n{level} ", start + len(heading))
    return " ".join(text[start : end if end > 0 else None].split())


def _cell(strategy: str, peak: int, *, sent: int = 1000, repeat: int = 0) -> Record:
    return make_record(
        strategy=strategy,
        repeat=repeat,
        peak_mem_bytes={"max": peak, "per_rank": [peak, peak]},
        comm_per_step={"sent_per_rank": sent, "ops": {}},
        env={"torch": "2.11.0", "device_name": "x86_64"},
    )


def _verdict(base: list[Record] | int, now: int, *, strategy: str, sent: int = 1000) -> dict[str, str]:
    """{metric: verdict} of a cell whose peak was ``base`` (or those repeats) and is ``now``."""
    before = [_cell(strategy, base)] if isinstance(base, int) else base
    (cell,) = compare_runs(before, [_cell(strategy, now, sent=sent)]).cells
    return {m.metric: m.verdict for m in cell.metrics}


def _peak(base: list[Record] | int, now: int, *, strategy: str) -> str:
    return _verdict(base, now, strategy=strategy)["peak_mem_bytes"]


@pytest.mark.parametrize("strategy", ["zero2", "fsdp2-zero3"])
def test_the_readme_states_the_memory_and_bytes_tolerance_the_gate_applies(strategy: str) -> None:
    """Memory is not gated to the byte: it may grow by what the README says, and one byte more
    regresses; bytes sent are, up or down. zero2's memory repeats to the byte (the small floor),
    FSDP2's does not (the larger one)."""
    gate = _section(ROOT / "README.md", "## Gate nightly CI")
    rule = re.search(MEMORY_RULE, gate)
    assert rule, f"the README's gate paragraph no longer states the memory rule: {gate}"
    assert "Bytes sent per step are gated to the byte, either way" in gate
    pct, floor = float(rule[1]), int(rule[2]) * KIB if strategy == "zero2" else int(rule[3]) * MIB
    small, big = 5 * MIB, 1 << 30
    assert _peak(small, small + 1, strategy=strategy) == "unchanged"
    assert _peak(small, small + floor, strategy=strategy) == "unchanged"
    assert _peak(small, small + floor + 1, strategy=strategy) == "regressed"
    allowed = int(big * pct / 100)  # the percentage, where it is above the floor
    assert _peak(big, big + allowed, strategy=strategy) == "unchanged"
    assert _peak(big, big + allowed + 1, strategy=strategy) == "regressed"
    spread = 3 * max(floor, allowed)  # the baseline's repeats, where they varied by more
    repeats = [_cell(strategy, big), _cell(strategy, big + spread, repeat=1)]
    assert _peak(repeats, big + 2 * spread, strategy=strategy) == "unchanged"
    assert _peak(repeats, big + 2 * spread + 1, strategy=strategy) == "regressed"
    for sent in (1001, 999):
        assert _verdict(small, small, strategy=strategy, sent=sent)["comm_sent_bytes"] == "regressed"


def test_the_docs_name_the_timed_steps_a_verdict_needs() -> None:
    """measuring.md's "Speed verdicts" and nightly.md name the fewest timed steps a step time is
    judged from: the number the verdicts use, and the words a run prints below it."""
    verdicts = _section(ROOT / "docs" / "measuring.md", "## Speed verdicts")
    (named,) = re.findall(r"\*\*fewer than (\d+) timed steps\*\*", verdicts)
    assert int(named) == Thresholds.min_steps
    nightly = " ".join((ROOT / "docs" / "nightly.md").read_text().split())
    assert {int(n) for n in re.findall(r"fewer than (\d+) timed steps", nightly)} == {Thresholds.min_steps}
    (quoted,) = {int(n) for n in re.findall(r'"(\d+) timed steps: not judged"', verdicts)}
    assert quoted < Thresholds.min_steps

    def cell(strategy: str) -> Record:
        timed = {"median": 0.1, "mad": 0.001, "n": quoted}
        return make_record(strategy=strategy, steps=quoted, step_time_s=timed)

    assert pair_verdict(cell("zero2"), cell("ddp")).note() == f"{quoted} timed steps: not judged"
