"""``shardbench plan``: every strategy planned in one table, the least sharding that fits
recommended, ``--max-batch`` adjacent to the first batch that does not fit, and a terminal
table no wider than 120 columns. Cells run in this process (``run_cell_here``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardbench.cli import main
from shardbench.harness import runner
from shardbench.harness.config import CellConfig
from shardbench.records import read_records
from shardbench.report.plan_report import PLAN_JSON
from shardbench.studies import maxsize
from shardbench.studies.plan import (
    PLAN_STRATEGIES,
    UNPLANNED,
    plannable,
    planning_cells,
    recommend,
    rows_from,
    sharding_level,
)
from shardbench.studies.plan_reserve import CUDA_RESERVE_FILE, Reserve, policy
from tests.cells import measured_once

ROOT = Path(__file__).resolve().parent.parent

ARGS = ["--workload", "transformer", "--preset", "tiny", "--world-size", "2"]


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch):
    """Cells run here, each measured once (the test measures some first to choose a budget)."""
    run_once = measured_once()
    monkeypatch.setattr(runner, "run_cell", run_once)
    monkeypatch.setattr(maxsize, "run_cell", run_once)
    return run_once


def _cells(batch: int, strategies=PLAN_STRATEGIES) -> list[CellConfig]:
    from shardbench.harness.validate import plan_cells

    return plan_cells(
        planning_cells(
            workload="transformer",
            preset="tiny",
            world_size=2,
            precision="fp32",
            batch_size=batch,
            activation_checkpointing=False,
            device="cpu",
            fake=True,
            timeout_s=900.0,
            strategies=strategies,
        )
    )


def test_sharding_levels() -> None:
    assert [sharding_level(s) for s in PLAN_STRATEGIES] == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]


def test_a_peer_that_cannot_be_planned_keeps_its_row(in_process, tmp_path: Path, capsys) -> None:
    out = tmp_path / "plan"
    argv = [
        "plan",
        *ARGS,
        "--budget",
        "1GiB",
        "--strategy",
        "ddp,deepspeed-zero2",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    rows = {r.strategy: r for r in rows_from(read_records([out]), 1 << 30, max_batch=False)}
    assert rows["ddp"].record.status == "ok" and rows["ddp"].fits
    peer = rows["deepspeed-zero2"]
    assert peer.unplanned and not peer.fits and not peer.failed and peer.record.predicted_mem_bytes
    printed = capsys.readouterr().out
    assert "recommended: ddp" in printed
    assert UNPLANNED in printed
    written = (out / "plan.md").read_text()
    assert f"{UNPLANNED}: deepspeed-zero2, measure with: shardbench run --workload transformer" in written
    table = printed.split("\nreport: ")[0]
    assert max(len(line) for line in table.splitlines()) <= 120


def test_budget_between_ddp_and_zero2(in_process, tmp_path: Path, capsys) -> None:
    peaks = {c.strategy: in_process(c, run_id="t").peak_mem_bytes["max"] for c in _cells(8, ("ddp", "zero2"))}
    assert peaks["zero2"] < peaks["ddp"]
    budget = (peaks["ddp"] + peaks["zero2"]) // 2
    out = tmp_path / "plan"
    strategies = ("ddp", "zero1", "zero2")  # every strategy: test_examples.py
    assert (
        main(["plan", *ARGS, "--budget", f"{budget}B", "--strategy", ",".join(strategies), "--out", str(out)])
        == 0
    )
    rows = {r.strategy: r for r in rows_from(read_records([out]), budget, max_batch=False)}
    assert tuple(rows) == strategies
    assert not rows["ddp"].fits and rows["zero2"].fits
    assert rows["zero2"].headroom == budget - peaks["zero2"]
    least = recommend(list(rows.values()))
    assert least is not None and least.level == min(r.level for r in rows.values() if r.fits)
    printed = capsys.readouterr().out
    summary = json.loads((out / PLAN_JSON).read_text())  # the plan's page leads with it
    # the fastest predicted strategy that fits is recommended; the least sharding is still named
    predicted = {r["strategy"]: r["predicted_step_time"]["step"] for r in summary["rows"] if r["fits"]}
    best = min(predicted, key=predicted.get)
    assert summary["least_sharding"] == least.strategy and summary["recommended"] == best
    assert f"recommended: {best}" in printed and (out / "plan.md").is_file()
    if best != least.strategy:
        assert f"{best} is predicted faster than {least.strategy}, the least sharding that fits" in printed
    header = next(line for line in printed.splitlines() if line.startswith("strategy "))
    assert header.split()[-4:] == ["step", "/rank", "/job", "MFU"]  # pred step, tok/s: a CPU's ranks
    assert summary["columns"][-4:] == ["pred step", "tokens/s/rank", "tokens/s/job", "MFU"]
    assert "network gloo" not in printed and "gloo probe at N=2" in printed
    table = printed.split("\nreport: ")[0]  # what follows are paths, as long as the directory's
    assert max(len(line) for line in table.splitlines()) <= 120
    assert summary["budget_bytes"] == budget
    page = (out / "index.html").read_text()
    assert page.index("budget per rank") < page.index(f"<dd>{best}</dd>") < page.index("<table")


def test_max_batch_is_adjacent_to_the_first_that_does_not_fit(in_process, tmp_path: Path) -> None:
    # batches 2 and 3 peak in backward, where the peak grows by the activations per sample
    # (batch 1 may peak in the optimizer step instead)
    p2, p3 = (in_process(_cells(b, ("zero2",))[0], run_id="t").peak_mem_bytes["max"] for b in (2, 3))
    budget = int(p3 + 1.5 * (p3 - p2))
    out = tmp_path / "plan"
    assert (
        main(
            [
                "plan",
                *ARGS,
                "--budget",
                f"{budget}B",
                "--max-batch",
                "--strategy",
                "ddp,zero2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    summaries = [r for r in read_records([out]) if r.suite == "max-size"]
    assert [r.strategy for r in summaries] == ["ddp", "zero2"]
    for r in summaries:
        fit, fail = r.max_size["largest_fit"], r.max_size["smallest_fail"]
        if fit is None:  # nothing fits: batch 1 is over the budget
            assert fail["batch_size"] == 1 and fail["peak_bytes"] > budget
            continue
        assert fail["batch_size"] == fit["batch_size"] + 1
        assert fit["peak_bytes"] <= budget < fail["peak_bytes"]
    rows = rows_from(read_records([out]), budget, max_batch=True)
    assert next(r for r in rows if r.strategy == "zero2").max_batch >= 4


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--budget", "lots"], "cannot read memory budget"),
        (["--budget", "1GiB", "--strategy", "nope"], "allowed: dp, ddp"),
        (["--budget", "1GiB", "--preset", "huge"], "unknown preset 'huge'"),
    ],
)
def test_bad_input_exits_2(argv, needle, tmp_path: Path, capsys) -> None:
    out = tmp_path / "o"
    assert main(["plan", *ARGS, *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_batch_size_and_max_batch_exclude_each_other(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["plan", *ARGS, "--budget", "1GiB", "--batch-size", "2", "--max-batch"])
    assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_a_cuda_only_peer_gets_a_command_with_device_cuda() -> None:
    from shardbench.studies.plan import measure_command
    from tests.records import make_record

    text = measure_command(make_record(world_size=2), ["deepspeed-zero2", "fairscale-zero3"])
    anywhere, cuda = text.split("; and ")
    assert "--strategy deepspeed-zero2 " in anywhere and "--device cuda --" not in anywhere
    assert "--strategy fairscale-zero3 " in cuda and cuda.split("(")[0].rstrip().endswith("--device cuda")


def test_a_reserve_moves_the_recommendation_and_the_headroom_is_after_it(
    in_process, tmp_path, capsys
) -> None:
    """ddp fits its peak alone; with a reserve beside each peak only zero2 does, and the
    headroom shown is what is left after the peak and the reserve."""
    peaks = {c.strategy: in_process(c, run_id="t").peak_mem_bytes["max"] for c in _cells(8, ("ddp", "zero2"))}
    budget = peaks["ddp"] + (1 << 10)
    reserve = budget - peaks["zero2"] - (1 << 10)  # zero2 keeps 1 KiB after it, ddp is over
    argv = ["plan", *ARGS, "--budget", f"{budget}B", "--strategy", "ddp,zero2"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    assert "recommended: ddp" in capsys.readouterr().out
    assert main([*argv, "--reserve", f"{reserve}B", "--out", str(tmp_path / "b")]) == 0
    printed = capsys.readouterr().out
    assert "recommended: zero2" in printed and "(--reserve)" in printed
    rows = {
        r.strategy: r
        for r in rows_from(
            read_records([tmp_path / "b"]), budget, max_batch=False, policy=policy("cpu", fixed=reserve)
        )
    }
    assert not rows["ddp"].fits and rows["zero2"].headroom == 1 << 10
    assert rows["zero2"].model_states and rows["zero2"].formula and rows["zero2"].record.params
    written = json.loads((tmp_path / "b" / "plan.json").read_text())
    assert written["recommended"] == "zero2" and written["budget_bytes"] == budget
    assert written["rows"][1]["headroom_bytes"] == 1 << 10 and "--reserve" in written["reserve"]
    for bad, needle in (("lots", "cannot read --reserve"), (f"{budget}B", "leaves nothing of --budget")):
        assert main([*argv, "--reserve", bad, "--out", str(tmp_path / "c")]) == 2
        assert needle in capsys.readouterr().err


def test_the_cuda_reserve_is_the_worst_measured_ratio_per_strategy() -> None:
    from shardbench.studies.plan import PlanRow
    from tests.records import make_record

    cuda = policy("cuda")
    assert cuda.ratios["ddp"] > 1 and cuda.worst == max(cuda.ratios.values())
    assert cuda.of("zero3").ratio == cuda.worst  # never measured on a GPU: the worst of all
    assert policy("cpu").of("ddp") == Reserve() and policy("cuda", fixed=5).of("ddp") == Reserve(fixed=5)
    mib = 1 << 20
    record = make_record(peak_mem_bytes={"max": 100 * mib})
    assert PlanRow("ddp", record, 110 * mib).fits  # its peak alone fits
    on_cuda = PlanRow("ddp", record, 110 * mib, reserve=cuda.of("ddp"))
    assert not on_cuda.fits and on_cuda.reserve_bytes == cuda.of("ddp").of(100 * mib) > 10 * mib


@pytest.mark.parametrize("reserve", [Reserve(), Reserve(fixed=1000), Reserve(fixed=7, ratio=1.1685)])
def test_the_usable_budget_is_the_largest_peak_that_fits_with_its_reserve(reserve) -> None:
    budget = 10_000_019
    usable = reserve.usable(budget)
    assert usable + reserve.of(usable) <= budget < usable + 1 + reserve.of(usable + 1) + 1


def test_the_reserve_data_is_derived_from_the_committed_gpu_records() -> None:
    """bench/suites/measured/cuda-reserve.toml is what scripts/derive_cuda_reserve.py writes from
    results/gpu/: change the records and the file must be derived again."""
    import runpy

    script = runpy.run_path(str(ROOT / "scripts" / "derive_cuda_reserve.py"))
    assert script["render"]() == CUDA_RESERVE_FILE.read_text()
    data = script["derive"](read_records(script["sources"]()[0]))
    ddp = data["ratio"]["ddp"]
    assert ddp["ratio"] > 1.15 and ddp["records"] > 1  # the allocator's cache on the H200


def test_a_long_model_config_title_breaks_only_between_its_items(capsys) -> None:
    """An hf: preset is its config, ``key=value`` items joined by colons: the title breaks
    between items or words, never inside a name or a number."""
    from shardbench.report.plan_report import print_plan
    from shardbench.studies.plan import Plan

    items = ["hidden_size=2048", "intermediate_size=5632", "num_hidden_layers=22", "num_attention_heads=32"]
    config = ":".join([*items, *items, "vocab_size=32000"])
    heading = f"plan: hf:LlamaForCausalLM {config} (Ψ = 1.1B parameters), N=8, fp32, budget 80GiB per rank"
    print_plan(Plan(rows=(), budget=1 << 30, policy=policy("cpu"), batch=8), title_text=heading)
    lines = capsys.readouterr().out.splitlines()
    title = lines[: next(i for i, line in enumerate(lines) if line.startswith("strategy"))]
    assert len(title) > 1 and max(map(len, lines)) <= 120
    assert "".join(title).replace(" ", "") == heading.replace(" ", "")
    for item in config.split(":"):
        assert any(item in line for line in title), item


PEERS = ("fairscale-zero1", "deepspeed-zero1", "fairscale-zero2", "deepspeed-zero2", "fairscale-zero3")


def test_each_row_of_the_plan_is_one_line_at_120_columns(monkeypatch, capsys) -> None:
    """Every column of a predicted CUDA plan, with a sequence model's tokens/s per GPU and for
    the whole job, and the peers measured only on real ranks: at 120 columns each strategy is
    one line (its fits cell short, the verdict under the table naming them; headers wider than
    their figures on two lines), and plan.md keeps the words whole."""
    from shardbench.report.plan_report import UNPLANNED_SHORT, plan_markdown, print_plan
    from shardbench.studies.plan import Plan, PlanRow
    from tests.records import make_record

    monkeypatch.setenv("COLUMNS", "120")
    mib, budget, cuda = 1 << 20, 160 << 20, policy("cuda")
    predicted = {
        "step": 6.05e-4,
        "tokens_per_s": 51545091.0,
        "mfu": 0.408,
        "peak_flops_per_s": 6.7e13,
        "peak_kind": "datasheet",
        "efficiency": 0.5,
        "network_source": "NVLink 4",
    }
    rows = [
        PlanRow(
            s,
            make_record(
                strategy=s,
                device="cuda",
                world_size=8,
                peak_mem_bytes={"max": peak * mib},
                model_state_bytes={"total": 38 * mib},
                predicted_mem_bytes={"total": 38 * mib},
                mem_breakdown_bytes={"activations": 80 * mib, "other": 0, "comm": 0},
            ),
            budget,
            reserve=cuda.of(s),
            predicted=predicted,
        )
        for s, peak in (("ddp", 193), ("zero2", 116), ("fsdp2-zero3", 91))
    ]
    rows += [
        PlanRow(p, make_record(strategy=p, status="skipped", predicted_mem_bytes={"total": 38 * mib}), budget)
        for p in PEERS
    ]
    plan = Plan(rows=tuple(rows), budget=budget, policy=cuda, batch=8)
    print_plan(plan, title_text="plan: transformer tiny, N=8 on cuda H100")
    lines = capsys.readouterr().out.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("strategy "))
    shown = lines[top + 1 : top + 1 + len(rows)]
    assert [line.split()[0] for line in shown] == [r.strategy for r in rows]
    assert lines[top + 1 + len(rows)].startswith("recommended: ")  # no row went on to a second line
    assert max(map(len, lines)) <= 120
    assert all(line.split()[2] == UNPLANNED_SHORT for line in shown[3:])
    # tokens/s per GPU (the job's over N=8) and the whole job's, each under its own label
    assert lines[top - 1].split()[-2:] == ["tok/s", "tok/s"]  # over the last line's, no MFU above
    assert [line.split()[-3:-1] for line in lines[top : top + 2]] == [["/GPU", "/job"], ["6.44M", "51.5M"]]
    assert f"{UNPLANNED}: {', '.join(PEERS)}, measure with" in " ".join(lines)
    written = plan_markdown(plan, title_text="plan")
    assert all(f"| {p} | " in written and f"| {UNPLANNED} |" in written for p in PEERS)
    assert "| pred step | tokens/s/GPU | tokens/s/job | MFU |" in written
    assert "| 605 µs | 6.44M | 51.5M | 40.8% |" in written


def test_gpu_without_device_plans_for_cuda_and_says_so(in_process, tmp_path: Path, capsys) -> None:
    """--gpu H100 alone is a CUDA plan (a CPU plan would ignore it): the cells are CUDA's, the
    step is predicted from the H100's datasheet over NVLink, and the title says the device and why."""
    out = tmp_path / "plan"
    assert (
        main(["plan", *ARGS, "--budget", "1GiB", "--strategy", "ddp", "--gpu", "H100", "--out", str(out)])
        == 0
    )
    printed = capsys.readouterr().out
    assert (
        printed.startswith("plan: transformer tiny (Ψ = ")
        and "N=2 on cuda H100 (--gpu implies --device cuda)" in printed
    )
    assert [r.device for r in read_records([out])] == ["cuda"]
    predicted = json.loads((out / PLAN_JSON).read_text())["rows"][0]["predicted_step_time"]
    assert predicted["peak_kind"] == "datasheet" and "NVLink" in predicted["network_source"]
    assert "N=2 on cuda H100 (--gpu implies --device cuda)" in (out / "plan.md").read_text()


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_the_measure_command_asks_the_cpu_only_for_what_it_runs_at_that_precision(precision: str) -> None:
    """FairScale's zero1 and zero2 train fp16 only on CUDA, as its zero3 does at any precision:
    each goes to the ``--device cuda`` command; the other command runs on the CPU as given."""
    from types import SimpleNamespace

    from shardbench.strategies.registry import check_runnable, cpu_has_fp16_kernels
    from shardbench.studies.plan import measure_command

    peers = [s for s in PLAN_STRATEGIES if not plannable(s)]
    record = SimpleNamespace(world_size=8, activation_checkpointing=False, workload="transformer",
                             preset="tiny", precision=precision, batch_size_per_rank=8)  # fmt: skip
    at_fp16 = {"fairscale-zero1", "fairscale-zero2"} if precision == "fp16" else set()
    if precision == "fp16" and not cpu_has_fp16_kernels():  # DeepSpeed's fp16 needs them on a CPU
        at_fp16 |= {s for s in peers if s.startswith("deepspeed")}
    *anywhere, cuda = measure_command(record, peers).split("; and ")
    assert len(anywhere) == (0 if set(peers) <= {"fairscale-zero3", *at_fp16} else 1)
    on_cuda = cuda.split("--strategy ")[1].split()[0].split(",")
    assert "--device cuda (on 8 GPUs)" in cuda and not any("--device cuda (on" in a for a in anywhere)
    assert set(on_cuda) == {"fairscale-zero3", *at_fp16}
    on_cpu = anywhere[0].split("--strategy ")[1].split()[0].split(",") if anywhere else []
    for strategy in on_cpu:
        try:
            check_runnable(strategy, "cpu", precision)
        except ValueError as e:  # a peer's package may be missing here; never CUDA
            assert "not installed" in str(e), e


@pytest.mark.parametrize(("preset", "unit", "peak"), [("tiny", "MiB", "8.6"), ("base", "GiB", "1.63")])
def test_the_plan_reads_its_sizes_in_the_unit_of_its_figures(preset: str, unit: str, peak: str) -> None:
    """A small model's peaks within a 1 GiB budget read in MiB (``8.6``), never ``0.01`` GiB;
    a peak past 1 GiB keeps the table in GiB."""
    from shardbench.harness.config import make_cell
    from shardbench.report.plan_report import table, title, verdict
    from shardbench.studies.plan import Plan, PlanRow
    from shardbench.studies.plan_reserve import ReservePolicy
    from tests.cells import stand_in_record  # a peak of 16 bytes per parameter

    cell = make_cell(workload="transformer", preset=preset, strategy="ddp", world_size=8, batch_size=8)
    budget = 1 << 30 if preset == "tiny" else 80 << 30
    plan = Plan((PlanRow("ddp", stand_in_record(cell), budget),), budget, ReservePolicy(device="cpu"), 8)
    columns, (row,) = table(plan)
    assert row[columns.index("peak")] == peak
    assert title(plan, cell, budget_text="1GiB").endswith(f"sizes in {unit}")
    assert f"peak {peak} + reserve " in verdict(plan) and f"{unit} headroom" in verdict(plan)
