"""The regression gate's rules on synthetic records: each verdict, the memory tolerance, the
time rule's threshold-and-noise test, repeats, environment checks, rules files, baselines."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from shardbench.cli import main
from shardbench.records import Record, append_record
from shardbench.studies.compare import EnvironmentChanged, NothingInCommon, compare_runs
from shardbench.studies.compare_rules import RATIO_METRIC, Rule, Rules, load_rules
from tests.records import make_record

ROOT = Path(__file__).resolve().parent.parent

GIB = 1 << 30
ENV = {"torch": "2.11.0", "device_name": "x86_64"}


def rec(**over: object) -> Record:
    """An ok CPU record: 1 GiB peak, 512 MiB model states, 100 ms steps (MAD 1 ms, 20 steps)."""
    fields: dict = dict(
        steps=20,
        warmup=3,
        peak_mem_bytes={"max": GIB, "per_rank": [GIB, GIB]},
        model_state_bytes={"total": GIB // 2},
        step_time_s={"median": 0.100, "mad": 0.001, "n": 20},
        env=dict(ENV),
    )
    return make_record(**{**fields, **over})


def timed(median: float, mad: float, n: int = 20) -> dict:
    return {"median": median, "mad": mad, "n": n}


#: absolute step time is gated only on a runner the rules declare dedicated
DEDICATED = Rules(dedicated=True)


def three(**over: object) -> list[Record]:
    """Three timed repeats of one record: what a dedicated runner's absolute time gate needs."""
    return [rec(**over, repeat=i) for i in range(3)]


def one(baseline: list[Record], current: list[Record], **kw: object):
    (cell,) = compare_runs(baseline, current, **kw).cells
    return cell


def verdicts(cell) -> dict[str, str]:
    return {m.metric: m.verdict for m in cell.metrics}


def test_same_records_are_unchanged() -> None:
    c = compare_runs([rec()], [rec()])
    assert [x.verdict for x in c.cells] == ["unchanged"] and c.exit_code == 0


def test_memory_tolerance_is_tight() -> None:
    """Default max(0.5%, a floor): +1% of a GiB fails, +0.3% passes. The floor is 64 KiB on the
    CPU for a strategy whose memory is the same to the byte run after run (ddp, ours), so a small
    cell's 2% growth fails; 1 MiB for one whose peak moves between runs (FSDP2), which a 0.9 MiB
    growth stays inside; and a cell whose baseline repeats varied is allowed that spread."""
    up1 = one([rec()], [rec(peak_mem_bytes={"max": int(GIB * 1.01)})])
    assert up1.verdict == "regressed" and verdicts(up1)["peak_mem_bytes"] == "regressed"
    assert up1.regressed
    up03 = one([rec()], [rec(peak_mem_bytes={"max": int(GIB * 1.003)})])
    assert up03.verdict == "unchanged"
    small = 5 << 20
    for strategy, grown, verdict in [
        ("zero2", 100 << 10, "regressed"),
        ("zero2", 20 << 10, "unchanged"),
        ("fsdp2-zero3", 900 << 10, "unchanged"),
        ("fsdp2-zero3", 1100 << 10, "regressed"),
    ]:
        floor = one(
            [rec(strategy=strategy, peak_mem_bytes={"max": small})],
            [rec(strategy=strategy, peak_mem_bytes={"max": small + grown})],
        )
        assert verdicts(floor)["peak_mem_bytes"] == verdict, (strategy, grown)
    varied = [
        rec(repeat=0, peak_mem_bytes={"max": small}),
        rec(repeat=1, peak_mem_bytes={"max": small - (300 << 10)}),
    ]
    within = one(varied, [rec(peak_mem_bytes={"max": small + (250 << 10)})])
    assert verdicts(within)["peak_mem_bytes"] == "unchanged"
    assert "varied by 307,200 B" in next(m.note for m in within.metrics if m.metric == "peak_mem_bytes")
    down = one([rec()], [rec(model_state_bytes={"total": GIB // 4})])
    assert down.verdict == "improved" and verdicts(down)["model_state_bytes"] == "improved"


def test_time_needs_threshold_and_noise() -> None:
    """On a dedicated runner: +30% with a small MAD regresses; +30% with a MAD larger than the
    difference does not."""
    quiet = one(three(), three(step_time_s=timed(0.130, 0.001)), rules=DEDICATED)
    assert verdicts(quiet)["step_time_s"] == "regressed" and quiet.regressed
    noisy = one(
        three(step_time_s=timed(0.100, 0.040)), three(step_time_s=timed(0.130, 0.040)), rules=DEDICATED
    )
    assert verdicts(noisy)["step_time_s"] == "unchanged" and noisy.verdict == "unchanged"
    # under the relative threshold (CPU 15%) even with no noise at all
    small = one(three(step_time_s=timed(0.1, 0.0)), three(step_time_s=timed(0.11, 0.0)), rules=DEDICATED)
    assert verdicts(small)["step_time_s"] == "unchanged"
    faster = one(three(), three(step_time_s=timed(0.05, 0.001)), rules=DEDICATED)
    assert faster.verdict == "improved"


def test_cuda_threshold_is_5_percent() -> None:
    def step(device: str, median: float) -> dict[str, str]:
        base, now = three(device=device), three(device=device, step_time_s=timed(median, 0.0001))
        return verdicts(one([replace(r, step_time_s=timed(0.1, 0.0001)) for r in base], now, rules=DEDICATED))

    assert step("cuda", 0.107)["step_time_s"] == "regressed"
    assert step("cpu", 0.107)["step_time_s"] == "unchanged"


def test_few_steps_compare_memory_only() -> None:
    cell = one([rec(step_time_s=timed(0.1, 0.0, n=3))], [rec(step_time_s=timed(0.5, 0.0, n=3))])
    assert "step_time_s" not in verdicts(cell) and cell.verdict == "unchanged"
    assert any("memory only" in n for n in cell.notes)


def test_failing_new_missing_and_passing_cells() -> None:
    other = dict(workload="swav")
    c = compare_runs(
        [rec(), rec(strategy="zero2", status="oom"), rec(**other)],
        [rec(status="error"), rec(strategy="zero2"), rec(strategy="zero1")],
    )
    got = {x.cell.split("/")[0] + "/" + x.cell.split("/")[2]: x.verdict for x in c.cells}
    assert got == {
        "transformer/ddp": "now failing",
        "transformer/zero2": "now passing",
        "transformer/zero1": "new",
        "swav/ddp": "missing",
    }
    assert c.exit_code == 1 and [x.verdict for x in c.regressions] == ["now failing"]
    assert c.cells[0].verdict == "now failing"  # regressions first
    # missing and new are reported, not failed
    assert compare_runs([rec(), rec(**other)], [rec(), rec(strategy="zero1")]).exit_code == 0


def test_repeats_use_the_median_and_their_spread() -> None:
    """Repeats in fresh processes: time is the median of their medians; their spread is noise."""
    base = [rec(step_time_s=timed(t, 0.001), repeat=i) for i, t in enumerate((0.10, 0.10, 0.10))]
    spread = [rec(step_time_s=timed(t, 0.001), repeat=i) for i, t in enumerate((0.09, 0.13, 0.17))]
    cell = one(base, spread, rules=DEDICATED)
    (time,) = [m for m in cell.metrics if m.metric == "step_time_s"]
    assert time.current == pytest.approx(0.13)
    assert time.verdict == "unchanged"  # 3 x hypot(0.001, 0.04) = 0.12 > 0.03
    flaky = one([rec(), rec(repeat=1)], [rec(), rec(repeat=1, status="timeout")])
    assert flaky.verdict == "now failing"


def test_environment_change_is_refused_unless_allowed() -> None:
    newer = rec(env={**ENV, "torch": "2.12.0"})
    with pytest.raises(EnvironmentChanged, match=r"torch: \['2.11.0'\] -> \['2.12.0'\]"):
        compare_runs([rec()], [newer])
    cell = one([rec()], [newer], allow_env_change=True)
    assert any("environment changed: torch" in n for n in cell.notes)
    with pytest.raises(EnvironmentChanged, match="schema"):
        compare_runs([rec(schema=2)], [rec()])


def test_layouts_that_measure_alike_compare_without_an_environment_change() -> None:
    """Schema 4 only typed how the step figures are written: a schema-3 baseline still judges it."""
    from shardbench.records import MEASURED_ALIKE

    assert MEASURED_ALIKE[4] == 3
    assert one([rec(schema=3)], [rec(schema=4)]).verdict == "unchanged"


def test_rules_file_overrides_and_ignores(tmp_path: Path) -> None:
    rules_file = tmp_path / "rules.toml"
    rules_file.write_text(
        "[memory]\ntolerance_pct = 2.0\n"
        '[[override]]\nworkload = "transformer"\ntime_pct = 50\nreason = "noisy on shared cores"\n'
        '[[ignore]]\nstrategy = "zero2"\nreason = "known: #99"\n'
    )
    rules = load_rules(rules_file)
    assert one([rec()], [rec(peak_mem_bytes={"max": int(GIB * 1.015)})], rules=rules).verdict == "unchanged"
    slower = one([rec()], [rec(step_time_s=timed(0.13, 0.001))], rules=rules)
    assert slower.verdict == "unchanged" and "threshold override: noisy on shared cores" in slower.notes
    ignored = compare_runs([rec(strategy="zero2")], [rec(strategy="zero2", status="oom")], rules)
    assert ignored.cells[0].verdict == "now failing" and ignored.cells[0].ignored == "known: #99"
    assert ignored.exit_code == 0 and ignored.unmatched_rules == []
    # a rule that selects no cell of either run is said, not silently kept
    swav_only = compare_runs([rec(workload="swav")], [rec(workload="swav")], rules)
    assert swav_only.unmatched_rules == [
        "[[override]] match {'workload': 'transformer'} ('noisy on shared cores')",
        "[[ignore]] match {'strategy': 'zero2'} ('known: #99')",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[memory]\ntolerance = 1\n", "unknown key.*tolerance.*allowed: tolerance_pct, tolerance_mib"),
        ("[time]\ncpu_pct = -1\n", "cpu_pct must be a non-negative number"),
        ("[[ignore]]\nworkload = 'swav'\n", "needs a reason"),
        ("[[override]]\nworkload = 'swav'\nreason = 'x'\n", "sets no threshold"),
        ("[[ignore]]\nmetrics = ['speed']\nreason = 'x'\n", "metrics must be a list of"),
        ("not toml [", "not valid TOML"),
    ],
)
def test_bad_rules_are_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_rules(path)


def write_run(directory: Path, records: list[Record]) -> Path:
    for r in records:
        append_record(directory / "records.jsonl", r)
    return directory


def test_compare_cli_writes_files_and_exits_1_on_regression(tmp_path: Path, capsys) -> None:
    base = write_run(tmp_path / "base", [rec(), rec(strategy="zero2")])
    cur = write_run(tmp_path / "cur", [rec(peak_mem_bytes={"max": 2 * GIB}), rec(strategy="zero2")])
    assert main(["compare", str(base), str(cur)]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "transformer/tiny/ddp/n2/fp32/b8/cpu" in out and "+100.00%" in out
    data = json.loads((cur / "compare.json").read_text())
    assert data["exit_code"] == 1 and data["counts"]["regressed"] == 1
    html = (cur / "compare.html").read_text()
    assert html.index('<tr class="regressed">') < html.index('<tr class="unchanged">')  # regressions first
    assert "### Regressions" in (cur / "compare.md").read_text()
    assert main(["compare", str(base), str(base), "--out", str(tmp_path / "same")]) == 0


def test_compare_cli_bad_input_exits_2(tmp_path: Path, capsys) -> None:
    base = write_run(tmp_path / "base", [rec()])
    assert main(["compare", str(base), str(tmp_path / "nowhere")]) == 2
    assert "not a run directory, a records file or a saved baseline name" in capsys.readouterr().err
    newer = write_run(tmp_path / "newer", [rec(env={**ENV, "torch": "2.12.0"})])
    assert main(["compare", str(base), str(newer)]) == 2
    assert "--allow-env-change" in capsys.readouterr().err
    assert main(["compare", str(base), str(newer), "--allow-env-change"]) == 0


def test_baseline_save_then_compare_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("SHARDBENCH_HOME", str(tmp_path))
    run = write_run(tmp_path / "run", [rec(name="nightly-x", env={**ENV, "git_sha": "abc"})])
    assert main(["baseline", "save", str(run), "--as", "nightly-x"]) == 0
    saved = tmp_path / "baselines" / "cpu" / "nightly-x.jsonl"
    manifest = json.loads(saved.with_suffix(".manifest.json").read_text())
    assert manifest["git_sha"] == ["abc"] and manifest["records"] == 1 and manifest["saved_by"]
    assert manifest["environment"]["torch"] == "2.11.0"
    assert main(["baseline", "save", str(run), "--as", "nightly-x"]) == 2  # no silent overwrite
    assert "--force" in capsys.readouterr().err
    assert main(["compare", "nightly-x", str(run)]) == 0
    assert main(["compare", "nightly-y", str(run)]) == 2
    assert "no baseline named 'nightly-y'" in capsys.readouterr().err


def test_a_baseline_of_two_machines_judges_each_against_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """``baseline save --add`` keeps another machine's records beside this one's; ``compare``
    reads the records of the current side's machine, never a mixture of both."""
    monkeypatch.setenv("SHARDBENCH_HOME", str(tmp_path))

    def on(cpu: str, peak: int, run: str) -> Record:
        env = {**ENV, "cpu_model": cpu, "device_name": cpu}
        return rec(
            name="nightly-x", env=env, run_id=run, peak_mem_bytes={"max": peak, "per_rank": [peak] * 2}
        )

    epyc = write_run(tmp_path / "epyc", [on("AMD EPYC", GIB, "e")])
    xeon = write_run(tmp_path / "xeon", [on("Intel Xeon", 2 * GIB, "x")])
    assert main(["baseline", "save", str(epyc), "--as", "nightly-x"]) == 0
    assert main(["baseline", "save", str(xeon), "--as", "nightly-x"]) == 2
    assert "--add" in capsys.readouterr().err
    assert main(["baseline", "save", str(xeon), "--as", "nightly-x", "--add"]) == 0
    assert main(["baseline", "save", str(xeon), "--as", "nightly-x", "--add"]) == 0  # replaces its own
    saved = tmp_path / "baselines" / "cpu" / "nightly-x.jsonl"
    manifest = json.loads(saved.with_suffix(".manifest.json").read_text())
    assert [m["run_ids"] for m in manifest["machines"]] == [["e"], ["x"]] and manifest["records"] == 2
    for cpu, peak, code in [("AMD EPYC", GIB, 0), ("Intel Xeon", 2 * GIB, 0), ("AMD EPYC", 2 * GIB, 1)]:
        now = write_run(tmp_path / f"now-{cpu}-{peak}", [on(cpu, peak, "n")])
        assert main(["compare", "nightly-x", str(now), "--out", str(tmp_path / "cmp")]) == code, (cpu, peak)
    arm = write_run(tmp_path / "arm", [on("Ampere Altra", GIB, "a")])
    capsys.readouterr()
    assert main(["compare", "nightly-x", str(arm)]) == 2  # no such machine: the last one added differs
    assert "cpu_model: ['Intel Xeon'] -> ['Ampere Altra']" in capsys.readouterr().err


def summary(fit: int | None, **over: object) -> Record:
    """A max-size search's summary record: the largest fit's params (None: nothing fitted)."""
    info = {"vary": "params", "budget_bytes": 16 * GIB, "largest_fit": {"params": fit} if fit else None}
    preset = {None: "tiny", 100: "small", 200: "base"}[fit]
    return rec(suite="max-size", max_size=info, preset=preset, status="ok" if fit else "oom", **over)


def test_max_size_answers_are_gated() -> None:
    """A search's answer is one cell whatever preset it ended on; any step down regresses, and
    nothing fitting ("oom") is an answer of 0, not a failed cell."""
    probe = rec(suite="max-size-probe", preset="huge", status="oom")
    same = compare_runs([summary(200), probe], [summary(200)])
    assert [(c.cell, c.verdict) for c in same.cells] == [
        ("transformer/max-size-params-16GiB/ddp/n2/fp32/b8/cpu", "unchanged")
    ]
    down = one([summary(200)], [summary(100)])
    assert down.verdict == "regressed" and down.metrics[0].metric == "max_trainable_params"
    assert one([summary(100)], [summary(200)]).verdict == "improved"
    assert one([summary(100)], [summary(None)]).verdict == "regressed"


def test_a_partial_ignore_covers_only_its_metrics() -> None:
    ignore = Rule(match={"strategy": "ddp"}, reason="noisy", metrics=("step_time_s",))
    rules = Rules(dedicated=True, ignores=(ignore,))
    slower = one(three(), three(step_time_s=timed(0.2, 0.001)), rules=rules)
    assert slower.verdict == "regressed" and slower.ignored == "noisy" and not slower.regressed
    grown = three(step_time_s=timed(0.2, 0.001), peak_mem_bytes={"max": 2 * GIB})
    bigger = one(three(), grown, rules=rules)
    assert bigger.regressed and not bigger.ignored  # memory regressed too: not covered
    counts = compare_runs(three(), three(step_time_s=timed(0.2, 0.001)), rules).counts()
    assert counts["ignored"] == 1 and counts["regressed"] == 0


def test_another_device_is_the_same_cell_when_allowed() -> None:
    """The device name is an environment fact: refused by default; when allowed, the cells still
    match (compared and marked), rather than all turning into new + missing."""
    h100 = dict(device="cuda", env={**ENV, "device_name": "NVIDIA H100"})
    h200 = dict(device="cuda", env={**ENV, "device_name": "NVIDIA H200"})
    with pytest.raises(EnvironmentChanged, match="device_name"):
        compare_runs([rec(**h100)], [rec(**h200)])
    cell = one([rec(**h100)], [rec(**h200)], allow_env_change=True)
    assert cell.verdict == "unchanged" and any("device_name" in n for n in cell.notes)


def test_cpu_model_is_checked_between_cpu_records() -> None:
    other = rec(env={**ENV, "cpu_model": "Intel Xeon"})
    with pytest.raises(EnvironmentChanged, match="cpu_model"):
        compare_runs([rec(env={**ENV, "cpu_model": "AMD EPYC"})], [other])
    assert compare_runs([rec()], [other]).exit_code == 0  # a baseline written before the field


def test_a_cpu_record_naming_its_processor_compares_with_one_naming_the_architecture() -> None:
    """On the CPU ``device_name`` is the processor's model, where older records (the committed
    baselines) hold only the architecture: the processor is compared once, as ``cpu_model``."""
    old = rec(env={**ENV, "device_name": "x86_64", "cpu_model": "AMD EPYC"})
    now = rec(env={**ENV, "device_name": "AMD EPYC", "cpu_model": "AMD EPYC"})
    assert compare_runs([old], [now]).exit_code == 0
    with pytest.raises(EnvironmentChanged, match="cpu_model"):
        compare_runs([old], [rec(env={**ENV, "device_name": "Intel Xeon", "cpu_model": "Intel Xeon"})])


def test_the_committed_cpu_baseline_compares_with_a_record_of_this_machine() -> None:
    from shardbench.records import capture_env, read_records

    saved = read_records([ROOT / "results/baselines/cpu/nightly-cpu.jsonl"])
    baseline = [r for r in saved if r.status == "ok"]
    env = {**baseline[0].env, "device_name": capture_env("cpu")["device_name"]}
    current = [replace(r, env=env) for r in baseline]
    assert compare_runs(baseline, current).exit_code == 0


def test_a_resumed_cell_counts_its_last_record() -> None:
    """``run --resume`` leaves an ``interrupted`` record, then the ok one for the same repeat."""
    resumed = [rec(status="interrupted", step_time_s=None), rec()]
    assert one([rec()], resumed).verdict == "unchanged"
    assert one(resumed, [rec()]).verdict == "unchanged"


def test_nothing_in_common_is_refused_and_nightly_fails_missing_cells() -> None:
    with pytest.raises(NothingInCommon, match="right baseline"):
        compare_runs([rec(workload="swav")], [rec()])
    # which key differs is said: the batch, here
    with pytest.raises(NothingInCommon, match="batch_size 8 in the baseline, 16 now; is it"):
        compare_runs([rec(batch_size_per_rank=8)], [rec(batch_size_per_rank=16)])
    lost = compare_runs([rec(), rec(strategy="zero2")], [rec()], missing_fails=True)
    assert lost.exit_code == 1 and [c.verdict for c in lost.regressions] == ["missing"]


def test_batch_searches_match_whatever_batch_they_found() -> None:
    def found(batch: int) -> Record:
        info = {"vary": "batch", "budget_bytes": GIB, "largest_fit": {"batch_size": batch, "params": 1000}}
        return rec(suite="max-size", max_size=info, batch_size_per_rank=batch)

    cell = one([found(64)], [found(32)])
    assert cell.cell == "transformer/tiny@max-size-batch-1GiB/ddp/n2/fp32/cpu" and cell.verdict == "regressed"
    assert cell.metrics[0].metric == "max_trainable_batch"


def test_a_baseline_of_several_runs_carries_their_spread(tmp_path: Path) -> None:
    """Step time on a shared CPU can sit in one mode for a whole process (measured: 57-62 ms in
    one run, 76-93 ms in others, for the same cell): a baseline of one fast run flags a normal
    night; one saved from several runs has their spread as noise."""
    fast = [rec(run_id="a", step_time_s=timed(0.060, 0.004), repeat=i) for i in (0, 1, 2)]
    slow = [rec(run_id="b", step_time_s=timed(0.085, 0.004), repeat=i) for i in (0, 1, 2)]
    night = [rec(run_id="n", step_time_s=timed(0.085, 0.003), repeat=i) for i in (0, 1, 2)]
    assert verdicts(one(fast, night, rules=DEDICATED))["step_time_s"] == "regressed"
    assert verdicts(one(fast + slow, night, rules=DEDICATED))["step_time_s"] == "unchanged"
    runs = [write_run(tmp_path / name, rs) for name, rs in (("a", fast), ("b", slow))]
    assert main(["baseline", "save", *map(str, runs), "--as", "two", "--root", str(tmp_path / "bl")]) == 0
    saved = tmp_path / "bl" / "baselines" / "cpu" / "two.jsonl"
    assert len(saved.read_text().splitlines()) == 6
    assert json.loads(saved.with_suffix(".manifest.json").read_text())["run_ids"] == ["a", "b"]


def test_memory_held_between_steps_is_gated() -> None:
    """A persistent extra buffer (e.g. DDP's buckets beside the gradients) that the peak hides."""
    held = {"total": GIB // 2, "held": GIB // 2 + (64 << 20)}
    grown = {"total": GIB // 2, "held": GIB // 2 + (96 << 20)}
    cell = one([rec(model_state_bytes=held)], [rec(model_state_bytes=grown)])
    assert verdicts(cell) == {
        "peak_mem_bytes": "unchanged",
        "model_state_bytes": "unchanged",
        "held_after_step_bytes": "regressed",
        "step_time_s": "not gated",
    }
    assert "held_after_step_bytes" not in verdicts(one([rec()], [rec()]))  # older records: not measured


def test_communicated_bytes_are_gated_exactly_either_way() -> None:
    """Bytes a step sends are deterministic: one byte more or less is a change in what the
    strategy communicates, and fails the gate; equal bytes pass; records without them skip."""
    sent = lambda n: {"sent_per_rank": n, "ops": {}}  # noqa: E731
    same = one([rec(comm_per_step=sent(1000))], [rec(comm_per_step=sent(1000))])
    assert verdicts(same)["comm_sent_bytes"] == "unchanged" and not same.regressed
    for changed in (1001, 999):
        cell = one([rec(comm_per_step=sent(1000))], [rec(comm_per_step=sent(changed))])
        assert verdicts(cell)["comm_sent_bytes"] == "regressed" and cell.regressed, changed
    assert "comm_sent_bytes" not in verdicts(one([rec()], [rec(comm_per_step=sent(5))]))
    ignored = Rules(ignores=(Rule({"strategy": "ddp"}, "known", metrics=("comm_sent_bytes",)),))
    assert not one([rec(comm_per_step=sent(1))], [rec(comm_per_step=sent(2))], rules=ignored).regressed


def test_every_regressed_row_comes_before_any_other(tmp_path: Path) -> None:
    """Rows of compare.md/.html list each metric of each cell; a regressed cell's step time (its
    ratio to ddp's) is its last metric, so the regressions stand first only if the rows, not the
    cells, are sorted."""
    from shardbench.report.compare_report import rows, to_html

    slow = {"step_time_s": timed(0.200, 0.001)}  # twice the baseline's 100 ms, ddp's unchanged
    # two repeats a side: a ratio of one pair is not judged
    baseline = [rec(strategy=s, repeat=i) for s in ("ddp", "zero2", "zero3", "zero1") for i in (0, 1)]
    current = [
        rec(strategy=s, repeat=i, **(slow if s in ("zero2", "zero1") else {}))
        for s in ("ddp", "zero2", "zero3", "zero1")
        for i in (0, 1)
    ]
    comparison = compare_runs(baseline, current)
    verdicts = [row[0] for row in rows(comparison)]
    assert verdicts[:2] == ["regressed", "regressed"] and "regressed" not in verdicts[2:], verdicts
    assert {row[2] for row in rows(comparison)[:2]} == {RATIO_METRIC}
    page = to_html(comparison, baseline="b", current="c")
    classes = [part.split('"')[0] for part in page.split('<tr class="')[1:]]
    assert classes[:2] == ["regressed", "regressed"] and "regressed" not in classes[2:], classes


def test_mfu_is_reported_beside_the_step_time_and_never_gated() -> None:
    """A cell whose MFU halved (its FLOPs counted differently, say) is not a regression: the
    step time is what is gated."""
    cell = one([rec(mfu=0.4)], [rec(mfu=0.2)])
    mfu = next(m for m in cell.metrics if m.metric == "mfu")
    assert (mfu.baseline, mfu.current, mfu.verdict, mfu.unit) == (0.4, 0.2, "not gated", "fraction")
    assert cell.verdict == "unchanged" and not cell.regressed
    assert "mfu" not in verdicts(one([rec()], [rec()]))  # records that counted no FLOPs: no row


def test_the_mfu_row_names_the_gate_the_step_time_rows_apply() -> None:
    """MFU's note never says the step time is gated where the step time's own row says it is
    not: on a shared runner the speed is gated as the ratio to ddp (where one is judged), on a
    dedicated runner with enough repeats as the time itself too, and otherwise by nothing."""

    def notes(comparison, strategy: str = "zero2") -> dict[str, str]:
        (cell,) = [c for c in comparison.cells if c.identity["strategy"] == strategy]
        return {m.metric: m.note for m in cell.metrics}

    def pair(repeats: int = 2, mfu: float = 0.3) -> list[Record]:
        return [rec(strategy=s, mfu=mfu, repeat=i) for i in range(repeats) for s in ("ddp", "zero2")]

    shared = notes(compare_runs(pair(), pair()))
    assert shared["step_time_s"].startswith("not gated (shared runner)")
    assert shared["mfu"].endswith("this cell's speed is gated as its step time's ratio to ddp")
    assert "step time, which is gated" not in shared["mfu"]
    alone = notes(compare_runs(pair(), pair()), "ddp")  # the reference: no ratio of its own
    assert alone["mfu"].endswith("nothing gates this cell's speed (its step_time_s row says why)")
    dedicated = notes(compare_runs(pair(3), pair(3), DEDICATED))
    assert dedicated["mfu"].endswith("gated as its step time's ratio to ddp and as its step time")
    one_run = notes(compare_runs(pair(1), pair(1)))  # a ratio of one pair is not judged
    assert one_run[RATIO_METRIC].startswith("not judged") and "nothing gates" in one_run["mfu"]


def test_the_headline_counts_the_cells_compared_and_says_what_the_run_lacks(tmp_path: Path, capsys) -> None:
    """Every cell on both sides: counted as compared, each by its verdict, no "others". A run of
    a part of the baseline passes (exit 0) on what it measured, and the headline says how many
    of the baseline's cells it lacks and how many cells it has the baseline lacks: the counts
    add up to each side's cells. Under ``nightly`` a lost cell is the regression and leads."""
    from shardbench.report.compare_report import summary_line

    same = compare_runs([rec(), rec(strategy="zero2")], [rec(), rec(strategy="zero2")])
    assert summary_line(same) == "no regression in 2 cells compared (2 unchanged); rules: defaults"
    baseline = [rec(), rec(strategy="zero2"), rec(strategy="zero1"), rec(workload="swav")]
    current = [rec(), rec(strategy="zero2", peak_mem_bytes={"max": GIB // 2}), rec(strategy="torch-zero1")]
    part = compare_runs(baseline, current)
    assert part.exit_code == 0
    assert summary_line(part) == (
        "no regression in 2 cells compared (1 improved, 1 unchanged); 2 of the baseline's 4 cells "
        "missing from this run (not measured, so not compared); 1 of this run's 3 cells new (not in "
        "the baseline); rules: defaults"
    )
    worse = compare_runs(baseline, [rec(status="oom"), rec(strategy="zero2")])
    assert summary_line(worse).startswith(
        "REGRESSION in 1 of 2 cells compared (1 now failing, 1 unchanged); 2 of the baseline's 4 cells "
        "missing from this run (not measured, so not compared);"
    )
    lost = compare_runs(baseline, current, missing_fails=True)
    assert summary_line(lost).startswith(
        "REGRESSION: 2 of the baseline's 4 cells missing from this run (each a regression: a lost "
        "measurement); no regression in 2 cells compared (1 improved, 1 unchanged); 1 of this run's 3"
    )
    base, cur = write_run(tmp_path / "base", baseline), write_run(tmp_path / "cur", current)
    assert main(["compare", str(base), str(cur)]) == 0
    out = capsys.readouterr().out
    assert "2 of the baseline's 4 cells missing from this run" in out and "the others" not in out
