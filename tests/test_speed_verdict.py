"""A run's speed verdict (``bench/studies/speed_verdict.py``) and the mark of a cell with more
ranks than cores: two runs of the same code never call one cell faster (or slower) and within
noise; repeats whose spread is small judge a real difference; a crowded cell's step time is
never judged, and every table says so. Records are the nightly baseline's real ones, or made by
hand (``tests/records.py``): nothing is trained."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from shardbench.records import CellKey, Record, oversubscription, read_records
from shardbench.report.summary_html import summary_table
from shardbench.report.tables import records_to_frame, to_markdown
from shardbench.report.terminal import flags, ratio_lines, terminal_table
from shardbench.studies.compare_rules import step_time_noise
from shardbench.studies.reference import step_time_ratio
from shardbench.studies.speed_verdict import (
    FASTER,
    NOT_JUDGED,
    SLOWER,
    WITHIN_NOISE,
    pair_verdict,
    speed_verdicts,
)
from shardbench.studies.versus import against_reference
from shardbench.wording import count
from tests.records import make_record

NIGHTLY = Path(__file__).resolve().parents[1] / "results" / "baselines" / "cpu" / "nightly-cpu.jsonl"
#: verdicts two runs of the same code must never give one cell
DISAGREE = ({FASTER, WITHIN_NOISE}, {SLOWER, WITHIN_NOISE}, {FASTER, SLOWER})


def _cell(strategy: str, ms: float, *, mad: float = 0.2, repeat: int = 0, run: str = "r", **kw) -> Record:
    """A timed cell of 20 steps: ``ms`` median, ``mad`` ms MAD."""
    return make_record(
        strategy=strategy,
        run_id=run,
        repeat=repeat,
        steps=20,
        step_time_s={"median": ms / 1e3, "mad": mad / 1e3, "n": 20},
        peak_mem_bytes={"max": 100 << 20 if strategy == "ddp" else 60 << 20, "per_rank": []},
        **kw,
    )


def _verdict(records: list[Record], strategy: str = "zero2"):
    (verdict,) = [v for k, v in speed_verdicts(records).items() if k.strategy == strategy]
    return verdict


def _disagreements(runs: dict[str, list[Record]]) -> list[tuple[CellKey, str, str]]:
    """(cell, verdict, verdict) wherever two of ``runs`` judge a cell in ways that disagree."""
    verdicts = {run: {k: v.word for k, v in speed_verdicts(rs).items()} for run, rs in runs.items()}
    return [
        (key, a[key], b[key])
        for a, b in itertools.combinations(verdicts.values(), 2)
        for key in a.keys() & b.keys()
        if {a[key], b[key]} in DISAGREE
    ]


def test_two_runs_of_the_same_code_never_disagree_on_real_records() -> None:
    """The nightly baseline: runs of the same code (three per processor), two repeats of each
    real-rank cell, on 2-core machines. Judged as each run's one repeat or its two, no two runs
    on one processor call a cell faster in one and slower in the other, and at most one cell of
    a processor's comparisons is slower (or faster) in one run and within noise in another:
    measured on the Intel set, swav zero1 read 1.167x +/- 0.159 ("slower") in one run and
    1.000x +/- 0.090 in another. Three errors of a two-pair estimate is a narrow band; the
    steps' MAD alone (one run's noise) disagrees far more, so the drift is in these records."""
    runs: dict[str, list[Record]] = defaultdict(list)
    machines: dict[str, set[str]] = defaultdict(set)  # a ratio is a machine's: compared within one
    for r in read_records([NIGHTLY]):
        runs[r.run_id].append(r)
        machines[(r.env or {}).get("device_name") or "?"].add(r.run_id)
    assert max(len(m) for m in machines.values()) >= 2, "the check needs two runs of the same code"
    once = {run: [r for r in rs if r.repeat == 0] for run, rs in runs.items()}
    for ids in machines.values():
        for judged in ({i: once[i] for i in ids}, {i: runs[i] for i in ids}):
            found = _disagreements(judged)
            assert not [d for d in found if {d[1], d[2]} == {FASTER, SLOWER}], found
            assert len(found) <= 1, found
    words = {v.word for rs in runs.values() for v in speed_verdicts(rs).values()}
    assert SLOWER in words, "with repeats, real differences are judged"

    def by_steps_alone(records: list[Record]) -> dict[CellKey, str]:
        cells = {CellKey.of(r): r for r in records if r.status == "ok"}
        out = {}
        for key, r in cells.items():
            base = cells.get(key._replace(strategy="ddp"))
            if key.strategy != "ddp" and base is not None and step_time_ratio(r, base):
                noise = step_time_noise(r, base, base_label="ddp") or ""
                slower = step_time_ratio(r, base) > 1
                out[key] = noise if noise == WITHIN_NOISE else SLOWER if slower else FASTER
        return out

    alone = [by_steps_alone(rs) for rs in once.values()]
    assert any(
        {a[k], b[k]} in DISAGREE for a, b in itertools.combinations(alone, 2) for k in a.keys() & b.keys()
    )


def test_one_run_is_never_faster_however_its_cells_drifted() -> None:
    """The same cells twice: zero2 at 0.64x ddp with tight steps (the machine drifted between
    the cells), then at 1.01x. The first is not judged, the second within noise, and the ratio
    line says how to have it judged."""
    first = [_cell("ddp", 100.0), _cell("zero2", 64.0)]
    second = [_cell("ddp", 100.0, mad=0.5, run="r2"), _cell("zero2", 101.0, mad=0.5, run="r2")]
    assert step_time_noise(first[1], first[0], base_label="ddp").startswith("beyond noise")
    assert (_verdict(first).word, _verdict(second).word) == (NOT_JUDGED, WITHIN_NOISE)
    assert _disagreements({"1": first, "2": second}) == []
    (line,) = ratio_lines(first)
    assert "zero2: 0.60x peak, 0.64x step time (one run: not judged)" in line
    hint = terminal_table(first).splitlines()[-1]
    assert hint.startswith("step time: one run cannot tell a speed-up from drift") and "--repeat 3" in hint
    (line,) = ratio_lines(second)
    assert "1.01x step time (within noise)" in line
    # a report of ddp from one run and zero2 from the other: never paired, never judged
    (line,) = ratio_lines([first[0], second[1]])
    assert "1.01x step time (different runs: not judged)" in line
    # merged with an older run whose ddp comes first: the cell's own verdict (faster, against its
    # own run's ddp) is not lent to the ratio against the other run's ddp
    older = _cell("ddp", 300.0, run="old")
    fast = _rounds((0.60, 0.62, 0.61))
    merged = [replace(older, repeat=i) for i in range(3)] + fast
    rows = [v for g in against_reference(merged) for v in g.others]
    assert {v.base.run_id for v in rows} == {"old"}
    assert {v.speed.note() for v in rows} == {"different runs: not judged"}
    # noisy steps: a ratio near 1 whose band reaches beyond 15% is not called within noise either
    noisy = [_cell("ddp", 100.0, mad=6.0), _cell("zero2", 101.0, mad=6.0)]
    assert _verdict(noisy).word == NOT_JUDGED and _verdict(noisy).band == pytest.approx(3 * 6 * 2**0.5 / 100)


def _rounds(ratios: tuple[float, ...]) -> list[Record]:
    """ddp at 100 ms and zero2 at each ratio of it, one round (repeat) per ratio."""
    return [
        cell
        for i, r in enumerate(ratios)
        for cell in (_cell("ddp", 100.0, repeat=i), _cell("zero2", 100.0 * r, repeat=i))
    ]


def test_repeats_judge_a_real_difference_and_not_drift() -> None:
    """Three repeats, round after round: a difference far beyond their small spread is faster
    (slower), one within a narrow band within noise; repeats that drift as far as the two runs
    above (0.64x, then 1.01x) are not judged."""
    ratios = {"fast": (0.60, 0.62, 0.61), "slow": (1.40, 1.42, 1.41), "same": (0.99, 1.01, 1.00)}
    verdicts = {name: _verdict(_rounds(rs)) for name, rs in ratios.items()}
    assert {name: v.word for name, v in verdicts.items()} == {
        "fast": FASTER,
        "slow": SLOWER,
        "same": WITHIN_NOISE,
    }
    fast = verdicts["fast"]
    assert fast.pairs == 3 and fast.ratio == pytest.approx(0.61)
    # the pairs stray 0.01 from their median: as a standard deviation (x 1.4826), as the standard
    # error of a median of three (x 1.2533 / sqrt 3), three of them (the steps' MAD is smaller)
    assert fast.band == pytest.approx(3 * 1.2533 * 1.4826 * 0.01 / 3**0.5, rel=1e-3)
    # beside MFU's ratio (the same speed's) the verdict stands without the step times' own ratio
    assert fast.note(with_ratio=False) == "3 repeats: faster"
    drift = _verdict(_rounds((0.64, 1.01)))
    assert drift.word == NOT_JUDGED and drift.band > abs(drift.ratio - 1)
    text = terminal_table(_rounds(ratios["fast"])).splitlines()
    lines = text[next(i for i, line in enumerate(text) if " vs ddp: " in line) :]
    assert [line.split(" vs ddp: ")[0] for line in lines[:3]] == [
        f"transformer tiny N=2 fp32 b=8 repeat {i}" for i in range(3)
    ]
    assert lines[0].endswith("zero2: 0.60x peak, 0.60x step time (3 repeats: 0.61x ± 0.03, faster)")
    assert all(line.endswith("(3 repeats: 0.61x ± 0.03, faster)") for line in lines[:3])
    assert lines[3].startswith(
        "step time: a step-time ratio is faster or slower where ratio ± 3 standard errors"
    )


def test_more_ranks_than_cores_is_marked_and_never_judged() -> None:
    """8 real ranks on 2 cores: the table's flag and legend, table.md's and the report's
    column, and a ratio line whose peak stands and whose step time is not judged. A record
    written before ``placement`` is read from its world size and the host's cores; a simulated
    world of 8 is one process."""
    n8 = dict(world_size=8, requested_world_size=8)
    placed = {"placement": {"ranks": 8, "cores": 2}}
    crowded = [_cell("ddp", 100.0, **n8, **placed), _cell("zero2", 64.0, **n8, **placed)]
    assert [oversubscription(r) for r in crowded] == ["more ranks than cores"] * 2
    assert _verdict(crowded).word == NOT_JUDGED
    (line,) = ratio_lines(crowded)
    assert "zero2: 0.60x peak, 0.64x step time (more ranks than cores: not judged)" in line
    text = terminal_table(crowded)
    assert flags(crowded[0]) == "R>C" and "R>C = more ranks than cores" in text
    md = to_markdown(records_to_frame(crowded))
    assert "| oversubscribed |" in md and "more ranks than cores: 8 on 2" in md
    assert "more ranks than cores: not judged" in summary_table(crowded)
    older = [replace(r, placement=None, env={"cpu_count": 2}) for r in crowded]
    assert _verdict(older).word == NOT_JUDGED and flags(older[1]) == "R>C"
    # repeats do not make a crowded cell's time a result
    rounds = [replace(r, repeat=i) for i in range(3) for r in crowded]
    assert _verdict(rounds).word == NOT_JUDGED
    simulated = [
        replace(r, simulated=True, backend="fake", placement=None, env={"cpu_count": 2}) for r in crowded
    ]
    assert oversubscription(simulated[0]) is None and "oversubscribed" not in records_to_frame(simulated)
    two = [_cell("ddp", 100.0, placement={"ranks": 2, "cores": 2})]
    assert oversubscription(two[0]) is None
    cuda = _cell("ddp", 100.0, device="cuda", backend="nccl", placement={"ranks": 2, "devices": 1})
    assert oversubscription(cuda) == "more ranks than devices" and flags(cuda) == "R>D"


def test_plan_and_claim_judge_one_pair_as_a_run_does() -> None:
    """plan's and the claim's timing cells are measured once each: never faster, whichever runs
    they came from (a resumed claim)."""
    base, ours = _cell("ddp", 100.0, run="a"), _cell("zero2", 64.0, run="b")
    assert pair_verdict(ours, base).note() == "one run: not judged"
    assert (
        pair_verdict(replace(ours, step_time_s={**ours.step_time_s, "median": 0.1005}), base).note()
        == WITHIN_NOISE
    )


def test_counts_in_verdicts_agree_with_their_nouns() -> None:
    """The claim's memory cells time one step: its verdict reads "1 timed step", not "1 timed
    steps"; three read "3 timed steps", in ``run``'s verdicts and ``compare``'s step-time rule."""
    base, ours = _cell("ddp", 100.0), _cell("zero2", 64.0)

    def stepped(r: Record, n: int) -> Record:
        return replace(r, steps=n, step_time_s={**r.step_time_s, "n": n})

    assert pair_verdict(stepped(ours, 1), stepped(base, 1)).note() == "1 timed step: not judged"
    assert pair_verdict(stepped(ours, 3), stepped(base, 3)).note() == "3 timed steps: not judged"
    one = step_time_noise(stepped(ours, 1), stepped(base, 1), base_label="ddp")
    assert one == "1 timed step: too few to tell from noise"
    assert count(1, "cell") == "1 cell" and count(0, "cell") == "0 cells"
    assert count(2, "process", "processes") == "2 processes"
