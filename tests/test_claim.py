"""``shardbench claim``: end to end on tiny presets (a verdict line per workload), and the
verdict rule on hand-made records.

The claim's cells (all simulated on the tiny spec) run in this process (tests/cells.py) rather
than in a fresh process each: what is under test here is the claim's pipeline, from the command
line to the report; the launcher has its own tests (test_run_end_to_end, test_maxsize)."""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

import shardbench.studies.claim as claim
import shardbench.studies.maxsize as maxsize
from shardbench.cli import main
from shardbench.records import Record, append_record, capture_env, read_records
from shardbench.report.claim_report import gate_section, write_claim_report
from shardbench.studies.claim_gate import compare_claims
from shardbench.studies.claim_result import WorkloadResult, ratio_text, results_from_records
from shardbench.studies.claim_specs import SPECS, ClaimWorkload
from tests.cells import run_cell_here
from tests.probes import seed_probes

#: the pipeline on two workloads: one whose max-size probes are planned under --fake and one
#: whose probes run real tensors (every workload's tiny cells run in test_workloads)
WORKLOADS = ("transformer", "deepspeech2")


def test_claim_end_to_end_on_tiny_presets(tmp_path: Path, capsys, monkeypatch) -> None:
    """The claim run against a baseline in which it held everywhere: exit 1 exactly when a
    workload's claim does not hold now, and the report says which ratio moved."""
    tiny = SPECS["tiny"]
    monkeypatch.setitem(
        SPECS, "tiny", replace(tiny, workloads=tuple(w for w in tiny.workloads if w.name in WORKLOADS))
    )
    monkeypatch.setattr(claim, "run_cell", run_cell_here)
    monkeypatch.setattr(maxsize, "run_cell", run_cell_here)
    monkeypatch.setenv("SHARDBENCH_HOME", str(tmp_path))
    seed_probes(tmp_path)
    held, n, env = tmp_path / "held.jsonl", SPECS["tiny"].world_size, capture_env("cpu")
    for w, ac in ((w, ac) for w in WORKLOADS for ac in (False, True)):
        for strategy, peak in (("ddp", 100), ("zero2", 40)):
            append_record(
                held,
                replace(
                    _record(strategy, peak, {}, 1.0),
                    activation_checkpointing=ac,
                    workload=w,
                    preset="tiny",
                    suite="claim-tiny",
                    world_size=n,
                    env=env,
                ),
            )
    assert main(["baseline", "save", str(held), "--as", "claim-held"]) == 0
    out = tmp_path / "claim"
    code = main(["claim", "--spec", "tiny", "--out", str(out), "--baseline", "claim-held"])
    report = (out / "report.md").read_text()
    verdicts = [line for line in report.splitlines() if line.startswith("- **")]
    labels = [w.label for w in SPECS["tiny"].variants()]  # each workload without and with AC
    assert labels[:2] == ["transformer", "transformer +AC"]
    assert [v.split("**")[1] for v in verdicts] == labels
    assert all(re.search(r": (HOLDS|DOES NOT HOLD|UNDECIDED|NOT MEASURED) - ", v) for v in verdicts), verdicts
    gate = report.split("## Against baseline `claim-held`")[1].strip().splitlines()
    assert [line.split(":")[0].removeprefix("- ") for line in gate] == labels
    failing = [v.split("**")[1] for v in verdicts if ": HOLDS - " not in v]
    assert code == (1 if failing else 0)
    assert [line.split(":")[0].removeprefix("- ") for line in gate if " - REGRESSED (" in line] == failing
    assert all("zero2/ddp peak 0.40x -> " in line for line in gate)
    # the verdicts rebuilt from the records (what a baseline is judged by) are the report's
    rebuilt = results_from_records(SPECS["tiny"], read_records([out]))
    assert [r.verdict(SPECS["tiny"].world_size)[0] for r in rebuilt] == [": HOLDS - " in v for v in verdicts]
    assert "not a measurement of the claim" in report  # tiny presets say what they are
    costs = [line for line in report.splitlines() if line.startswith("  - sharding's cost in throughput")]
    assert len(costs) == len(labels) and all("zero2: throughput " in c and "; zero3: " in c for c in costs)
    for chart in (line.split("(")[-1].rstrip(")") for line in report.splitlines() if line.startswith("![")):
        assert (out / chart).is_file()
    records = read_records([out])
    assert {r.workload for r in records} == set(WORKLOADS)
    # zero3 is measured like zero2 (peak and largest model) and shown in the table
    searched = ("ddp", "zero2", *SPECS["tiny"].further)
    assert "zero3" in searched
    assert sum(r.suite == "max-size" for r in records) == len(searched) * len(labels)
    assert {r.strategy for r in records if r.suite == "max-size"} == set(searched)
    table = report.split("## Measurements")[1]
    assert "zero3 peak MiB" in table and "zero3/ddp max-size" in table  # a 64 MiB budget: MiB
    assert {r.activation_checkpointing for r in records} == {False, True}
    assert (out / "index.html").is_file()
    # --from-records rebuilds the same verdicts without measuring; variants without records
    # (a claim stopped part-way) are listed as not measured
    plain = [r for r in records if not r.activation_checkpointing]
    (out / "records.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in plain))
    monkeypatch.setattr(claim, "run_cell", None)  # nothing may run
    assert main(["claim", "--spec", "tiny", "--out", str(out), "--from-records"]) == 0
    rebuilt = [line for line in (out / "report.md").read_text().splitlines() if line.startswith("- **")]
    assert [v for v in rebuilt if "+AC" not in v] == [v for v in verdicts if "+AC" not in v]
    assert all(": NOT MEASURED - " in v for v in rebuilt if "+AC" in v) and len(rebuilt) == len(verdicts)
    # --resume measures only what the records lack (here: transformer's zero3 searches, whose one
    # probe is the known memory cell), and reports every variant
    lacking = [
        r for r in records if not (r.workload == "transformer" and r.strategy == "zero3" and r.max_size)
    ]
    assert len(lacking) == len(records) - 2
    (out / "records.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in lacking))
    monkeypatch.setattr(claim, "run_cell", None)
    monkeypatch.setattr(maxsize, "run_cell", None)
    assert main(["claim", "--spec", "tiny", "--out", str(out), "--resume"]) == 0
    added = read_records([out])[len(lacking) :]
    assert [(r.workload, r.strategy, r.suite) for r in added] == [("transformer", "zero3", "max-size")] * 2
    resumed = [line for line in (out / "report.md").read_text().splitlines() if line.startswith("- **")]
    assert resumed == verdicts


def _record(strategy: str, peak: int, breakdown: dict[str, int], step_s: float) -> Record:
    return Record(
        run_id="x", suite="claim", workload="w", preset="p", params=100, strategy=strategy, world_size=8,
        requested_world_size=8, simulated=True, backend="fake", device="cpu", precision="fp32",
        batch_size_per_rank=1, steps=1, warmup=1, status="ok", peak_mem_bytes={"max": peak},
        mem_breakdown_bytes=breakdown, step_time_s={"median": step_s},
    )  # fmt: skip


def test_verdict_rule_and_its_explanation() -> None:
    ddp_bd = {"params": 40, "grads": 40, "optimizer": 80, "activations": 40, "other": 0}
    res = WorkloadResult(ClaimWorkload("w", "p", 1))
    res.memory = {"ddp": _record("ddp", 200, ddp_bd, 1.0), "zero2": _record("zero2", 99, ddp_bd, 1.2)}
    res.timing = dict(res.memory)
    holds, text = res.verdict(8)
    assert holds and "zero2 peak = 0.49x ddp" in text and "step time 1.20x ddp" in text
    # 10 parameters at fp32 on N=8: at its peak zero2 holds its parameters (40 B), its optimizer
    # shard (80 B / 8), the activations (40 B) and 11 B of reduce buckets a perfect one need not
    mine = {"params": 40, "grads": 0, "optimizer": 10, "activations": 40, "comm": 11, "other": 0}
    res.memory["zero2"] = replace(_record("zero2", 101, mine, 1.2), params=10)
    holds, text = res.verdict(8)
    assert holds is False and "zero2 peak = 0.51x ddp" in text and "20% activations" in text
    assert "even a perfect ZeRO-2 would hold at least 0.45x DDP's peak" in text  # (40 + 10 + 40) / 200
    assert "zero2 measured 0.51x, holding 11 B beyond that, most of it comm" in text


def test_the_cost_line_sets_throughput_beside_memory_and_never_calls_noise_a_loss() -> None:
    """zero2 and zero3 against ddp on real ranks (one timing run each): a ratio within the
    steps' noise is "within noise", one beyond it "one run: not judged", never higher or lower;
    a real zero3 timing cell is a timing cell, not a peer's memory cell."""
    spec = SPECS["cpu"]
    w = spec.workloads[0]

    def timed(strategy: str, ms: float, peak: int | None = None, **kw) -> Record:
        return replace(
            _record(strategy, peak or 0, {}, ms / 1e3),
            workload=w.name, preset=w.preset, suite="claim-cpu", steps=20,
            step_time_s={"median": ms / 1e3, "mad": 1e-3, "n": 20},
            peak_mem_bytes={"max": peak} if peak else None, **kw,
        )  # fmt: skip

    real = dict(world_size=spec.timing_world_size, simulated=False, backend="gloo")
    records = [
        *(timed(s, 100.0, peak) for s, peak in (("ddp", 200), ("zero2", 120), ("zero3", 80))),
        timed("ddp", 100.0, **real),
        timed("zero2", 125.0, **real),  # 0.80x, far beyond 3 x the combined MAD (4%)
        timed("zero3", 102.0, **real),  # 0.98x, within it
    ]
    (res,) = results_from_records(spec, records)[:1]
    assert set(res.timing) == {"ddp", "zero2", "zero3"} and not res.real_memory
    assert res.cost_line(("zero2", "zero3")) == (
        "zero2: throughput 0.80x ddp (one run: not judged), peak 0.60x ddp; "
        "zero3: throughput 0.98x ddp (within noise), peak 0.40x ddp"
    )
    del res.timing["zero3"]
    assert res.cost_line(("zero3",)) == "zero3: throughput not measured, peak 0.40x ddp"


def test_claim_gate_flags_a_claim_that_stopped_holding() -> None:
    """Pure: the baseline's verdicts are rebuilt from its records by the same rule; a workload
    that held there and does not now is the one regression, named with the ratio that moved."""
    spec = SPECS["tiny"]
    n = spec.world_size

    def memory(workload: str, zero2_peak: int) -> list[Record]:
        return [
            replace(
                _record(s, p, {}, 1.0), workload=workload, preset="tiny", suite="claim-tiny", world_size=n
            )
            for s, p in (("ddp", 100), ("zero2", zero2_peak))
        ]

    baseline = [*memory("transformer", 40), *memory("imagegpt", 80)]
    now = results_from_records(spec, [*memory("transformer", 60), *memory("imagegpt", 40)])
    changes = {c.workload: c for c in compare_claims(spec, baseline, now)}
    assert changes["transformer"].regressed and not changes["imagegpt"].regressed
    assert changes["transformer"].moved.startswith("zero2/ddp peak 0.40x -> 0.60x")
    assert "transformer: holds -> does not hold - REGRESSED" in gate_section("b", list(changes.values()))
    # searched, but without a boundary: the size test is unresolved, and the gate says so
    searches = [
        replace(_record(s, 1, {}, 1.0), workload="transformer", preset="tiny", suite="claim-tiny",
                world_size=n, max_size={"largest_fit": {"params": 100}, "smallest_fail": None})
        for s in ("ddp", "zero2")
    ]  # fmt: skip
    now = results_from_records(spec, [*memory("transformer", 60), *searches])
    (change,) = compare_claims(spec, baseline, now)
    assert "transformer: holds -> undecided - REGRESSED" in gate_section("b", [change])


def test_claim_results_keep_checkpointed_cells_apart() -> None:
    """Each workload is judged twice, without and with activation checkpointing, from its own
    records: an AC record never stands in for a plain one."""
    spec = SPECS["tiny"]
    n = spec.world_size

    def memory(ac: bool, zero2_peak: int) -> list[Record]:
        return [
            replace(
                _record(s, p, {}, 1.0),
                workload="swav",
                preset="tiny",
                suite="claim-tiny",
                world_size=n,
                activation_checkpointing=ac,
            )
            for s, p in (("ddp", 100), ("zero2", zero2_peak))
        ]

    results = results_from_records(spec, [*memory(False, 60), *memory(True, 30)])
    by_label = {r.workload.label: r for r in results}
    assert set(by_label) == {"swav", "swav +AC"}
    assert by_label["swav"].memory_ratio() == 0.6 and by_label["swav +AC"].memory_ratio() == 0.3


@pytest.mark.parametrize(
    ("fits", "fails", "decided"),
    [
        ((100, 205), (101, 206), True),  # 2.05x; at least 205/101 = 2.03x
        ((100, 199), (103, 210), None),  # 1.99x, between 1.93x and 2.10x: straddles 2x
        ((100, 190), (101, 195), False),  # 1.90x, at most 1.95x
    ],
)
def test_the_size_test_is_decided_on_the_brackets(fits, fails, decided) -> None:
    """zero2's largest model >= 2x DDP's holds only when the brackets prove it, fails only when
    they rule it out; a ratio whose bracket straddles 2x is undecided, and said so."""
    res = WorkloadResult(ClaimWorkload("w", "p", 1))
    for strategy, fit, fail in zip(("ddp", "zero2"), fits, fails, strict=True):
        info = {"largest_fit": {"params": fit}, "smallest_fail": {"params": fail}}
        res.max_size[strategy] = replace(_record(strategy, 1, {}, 1.0), max_size=info)
    assert res.size_decides() is decided
    holds, text = res.verdict(8)
    assert holds is (decided is True)
    assert ("undecided at this resolution" in text) is (decided is None)


@pytest.mark.parametrize(
    ("searched", "outcome"),
    [
        ({"ddp": ((100, 101)), "zero2": (199, 210)}, "undecided"),  # the brackets straddle 2x
        ({"ddp": (100, None), "zero2": (150, None)}, "undecided"),  # no boundary in the sizes searched
        ({"ddp": (100, 101), "zero2": (150, 155)}, "does not hold"),  # at most 1.55x: ruled out
        ({"ddp": (100, 101), "zero2": (210, 215)}, "holds"),
    ],
)
def test_an_unresolved_size_test_is_undecided_not_a_failure(searched, outcome) -> None:
    """docs/claim.md: when zero2's peak is above half of DDP's, the size test decides; while it
    is unresolved the verdict is "undecided", never "does not hold"."""
    ddp_bd = {"params": 40, "grads": 40, "optimizer": 80, "activations": 40, "other": 0}
    res = WorkloadResult(ClaimWorkload("w", "p", 1))
    res.memory = {"ddp": _record("ddp", 200, ddp_bd, 1.0), "zero2": _record("zero2", 130, ddp_bd, 1.0)}
    for strategy, (fit, fail) in searched.items():
        info = {"largest_fit": {"params": fit}, "smallest_fail": fail and {"params": fail}}
        res.max_size[strategy] = replace(_record(strategy, 1, {}, 1.0), max_size=info)
    assert res.outcome(8) == outcome


def test_a_peer_on_real_ranks_gets_its_own_verdict_line(tmp_path: Path, monkeypatch) -> None:
    """--peers on a spec with real ranks: FairScale's OSS + ShardedDataParallel (the claim's own
    implementation) is measured on them beside ddp and zero2 at the same N, with a verdict line
    of its own, rebuilt the same from the records."""
    spec = replace(
        SPECS["tiny"],
        workloads=(ClaimWorkload("transformer", "tiny", 2, ladder=("tiny",)),),
        activation_checkpointing=(False,),
        further=(),
        timing_world_size=2,
        real_peers=("fairscale-zero2",),
    )
    monkeypatch.setattr(claim, "run_cell", run_cell_here)
    monkeypatch.setattr(maxsize, "run_cell", run_cell_here)
    out = tmp_path / "claim"
    done = claim.claim(spec, out_dir=out)
    results = done.results
    text = write_claim_report(spec, results, out, done.wall_s).read_text()
    peer_lines = [line for line in text.splitlines() if line.startswith("  - fairscale-zero2 (")]
    assert len(peer_lines) == 1 and "Lightning's ddp_sharded" in peer_lines[0]
    assert re.search(
        r": (HOLDS|DOES NOT HOLD) - peak = \d\.\d\dx ddp at real N=2 \(ours, zero2: ", peer_lines[0]
    )
    assert "ZeRO-2's model states are at best 0.6" in peer_lines[0]  # (4 + 12/2) / 16 at N=2
    assert "## Peers on real ranks" in text
    (res,) = results
    assert set(res.real_memory) == {"ddp", "zero2", "fairscale-zero2"}
    assert all(r.status == "ok" and r.world_size == 2 and not r.simulated for r in res.real_memory.values())
    (rebuilt,) = results_from_records(spec, read_records([out]))
    assert rebuilt.peer_verdicts() == res.peer_verdicts() and set(rebuilt.timing) == {"ddp", "zero2"}


def test_the_claims_searches_count_plans_reserve_on_cuda(tmp_path: Path, monkeypatch) -> None:
    """The claim's max-size searches judge a fit as ``plan`` does: on a CUDA spec each strategy's
    search counts plan's CUDA reserve (``--reserve`` replaces it) and the report says so; on the
    CPU none is counted and the report says nothing of it. Stand-in cells: nothing runs."""
    import shardbench.report.claim_report as claim_report
    from shardbench.studies.plan_reserve import policy
    from tests.cells import stand_in_record

    monkeypatch.setattr(claim, "run_cell", stand_in_record)
    monkeypatch.setattr(maxsize, "run_cell", stand_in_record)
    monkeypatch.setattr(claim_report, "build_report", lambda *_: type("R", (), {"charts": []}))
    one = ClaimWorkload("transformer", "tiny", 2, ladder=("tiny", "small"))
    cpu = replace(SPECS["tiny"], workloads=(one,), activation_checkpointing=(False,))
    for spec, reserves in (
        (replace(cpu, device="cuda"), policy("cuda")),
        (replace(cpu, device="cuda", reserve_bytes=1 << 20), policy("cuda", fixed=1 << 20)),
        (cpu, policy("cpu")),
    ):
        out = tmp_path / f"{spec.device}-{spec.reserve_bytes}"
        (res,) = claim.run_claim(spec, out_dir=out, run_id="t", progress=str)
        searched = {s: maxsize.kept_reserve(r.max_size) for s, r in res.max_size.items()}
        assert searched == {s: reserves.of(s) for s in ("ddp", "zero2", *spec.further)}
        # on the card the allocator is capped at what the budget leaves beside the fixed part
        cap = res.max_size["ddp"].max_size["allocator_cap_bytes"]
        assert cap == (2**26 - reserves.of("ddp").fixed if spec.device == "cuda" else None)  # 64MiB
        report = write_claim_report(spec, [res], out, None).read_text()
        counted = "A model fits when its peak and the reserve `plan` keeps beside it" in report
        assert counted is (spec.device == "cuda")
        for s, r in searched.items() if counted else ():  # the share of the peak, or --reserve's size
            assert (f"{s} {r.ratio - 1:.2%} of its peak" if r.ratio > 1 else f"{s} 1.00 MiB") in report


def test_a_claim_at_fp16_measures_every_cell_at_fp16_into_its_own_folder(tmp_path: Path, monkeypatch) -> None:
    """``claim --precision fp16``: every cell (memory and max-size probes) runs at fp16 with the
    formula's model states, the report goes beside the fp32 claim's and says its precision, and
    records at another precision in its folder are never read as its own."""
    one = ClaimWorkload("transformer", "tiny", 2, ladder=("tiny",))
    monkeypatch.setitem(
        SPECS, "tiny", replace(SPECS["tiny"], workloads=(one,), activation_checkpointing=(False,))
    )
    monkeypatch.setattr(claim, "run_cell", run_cell_here)
    monkeypatch.setattr(maxsize, "run_cell", run_cell_here)
    monkeypatch.setenv("SHARDBENCH_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    seed_probes(tmp_path)
    assert main(["claim", "--spec", "tiny", "--precision", "fp16"]) == 0
    out = tmp_path / "results" / "claim" / "tiny-fp16"
    records = read_records([out])
    assert records and {r.precision for r in records} == {"fp16"}
    for r in records:
        if r.suite == "claim-tiny":
            assert r.status == "ok", r.error
            states = {k: r.model_state_bytes[k] for k in ("params", "grads", "optimizer")}
            assert states == pytest.approx({k: r.predicted_mem_bytes[k] for k in states}, rel=0.01)
    report = (out / "report.md").read_text()
    assert "(tiny, fp16)" in report.splitlines()[0] and "N=4, fp16, equal per-rank batch" in report
    # the same spec at fp32 finds none of these records its own
    assert results_from_records(SPECS["tiny"], records) == []
    assert results_from_records(replace(SPECS["tiny"], precision="fp16"), records)


def test_a_claims_real_peer_without_an_fp16_path_here_is_left_out_in_one_line(capsys) -> None:
    pytest.importorskip("fairscale")
    pytest.importorskip("deepspeed")
    from shardbench.cli.claim import real_peers

    assert real_peers(replace(SPECS["cpu"], precision="fp16")) == ("deepspeed-zero2",)
    (line,) = [s for s in capsys.readouterr().out.splitlines() if s.startswith("shardbench claim:")]
    assert line.startswith("shardbench claim: fairscale-zero2 left out: it trains fp16 only on CUDA")
    assert real_peers(SPECS["cpu"]) == ("fairscale-zero2", "deepspeed-zero2")


def test_claim_without_cuda_suggests_only_what_claim_accepts(monkeypatch, capsys) -> None:
    """``claim --device cuda`` on a machine without CUDA is refused before anything runs, and the
    refusal names only flags ``claim`` has (a claim is measured: it has no --fake to plan)."""
    import torch

    from shardbench.cli import build_parser

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(claim, "run_cell", None)  # nothing may run
    assert main(["claim", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "CUDA is not available here; use " in err
    suggested = set(re.findall(r"--[a-z][a-z-]*", err.split("; use ", 1)[1]))
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    accepted = set(sub.choices["claim"]._option_string_actions)
    assert suggested and suggested <= accepted, suggested - accepted


def test_the_report_gives_the_command_that_reproduces_it(tmp_path: Path, monkeypatch) -> None:
    """report.md's "How it was produced" names every flag that changed the spec (and --out),
    and that command, rebuilding from the records, reads every one of them as its own."""
    import shardbench.report.claim_report as claim_report
    from shardbench.cli import build_parser
    from tests.cells import stand_in_record

    monkeypatch.setattr(claim, "run_cell", stand_in_record)
    monkeypatch.setattr(maxsize, "run_cell", stand_in_record)
    monkeypatch.setattr(claim_report, "build_report", lambda *_: type("R", (), {"charts": []}))
    monkeypatch.setenv("SHARDBENCH_HOME", str(tmp_path))
    out = tmp_path / "claim"
    flags = ["--precision", "fp16", "--peers", "--workload", "transformer", "--world-size", "2"]
    flags += ["--budget", "32MiB", "--reserve", "1MiB", "--out", str(out)]
    assert main(["claim", "--spec", "tiny", *flags]) == 0

    def how_and_verdicts() -> tuple[str, list[str]]:
        lines = (out / "report.md").read_text().splitlines()
        how = lines[lines.index("## How it was produced") + 2]
        return how.split("`")[1], [line for line in lines if line.startswith("- **")]

    command, verdicts = how_and_verdicts()
    assert command == shlex.join(["shardbench", "claim", "--spec", "tiny", *flags])
    assert verdicts and not any("NOT MEASURED" in v for v in verdicts)
    monkeypatch.setattr(claim, "run_cell", None)  # nothing may run
    assert main([*shlex.split(command)[1:], "--from-records"]) == 0
    assert how_and_verdicts() == (command, verdicts)
    # workloads of one's own: their shape and batch too, in flags the parser accepts
    from shardbench.studies.claim_specs import claim_command

    own = ClaimWorkload("hf:GPT2LMHeadModel", "n_layer=2:n_embd=64", 3, ladder=("n_layer=2:n_embd=64",))
    spec = replace(SPECS["cpu"], workloads=(SPECS["cpu"].workloads[0], own))
    command = claim_command(spec)
    assert command == (
        "shardbench claim --spec cpu --workload transformer,hf:GPT2LMHeadModel "
        "--model-config n_layer=2:n_embd=64 --batch-size 3"
    )
    build_parser().parse_args(shlex.split(command)[1:])
    assert claim_command(SPECS["cpu"]) == "shardbench claim --spec cpu"


# breakdowns measured at the tiny presets, N=4 (ddp's at its peak, zero2's at its own): imagegpt
# at fp32 and swav at fp16, where the bound once read 0.73x and 0.58x beside 0.71x and 0.50x
CATEGORIES = ("params", "grads", "optimizer", "activations", "comm", "other")
MEASURED = {  # parameters, then ddp's and zero2's bytes by CATEGORIES
    "imagegpt fp32": (
        169472,
        (677888, 677888, 1355872, 2879480, 0, 10240),
        (677888, 0, 338960, 2263560, 677888, 10240),
    ),
    "swav fp16": (
        392248,
        (1568992, 1568992, 3138648, 2058936, 0, 150384),
        (784496, 0, 1176820, 1369848, 784496, 136848),
    ),
}


@pytest.mark.parametrize("case", MEASURED)
def test_a_perfect_zero2_is_never_said_to_beat_the_measured_one(case: str) -> None:
    """The "perfect ZeRO-2" of the explanation is a bound from the measured breakdown at the run's
    precision: never above what zero2 measured; without zero2's breakdown, no number at all."""
    precision = case.split()[1]
    params, ddp, zero2 = (
        MEASURED[case][0],
        *(dict(zip(CATEGORIES, b, strict=True)) for b in MEASURED[case][1:]),
    )
    res = WorkloadResult(ClaimWorkload(case.split()[0], "tiny", 2))
    res.memory = {
        s: replace(_record(s, sum(bd.values()), bd, 1.0), params=params, precision=precision, world_size=4)
        for s, bd in (("ddp", ddp), ("zero2", zero2))
    }
    holds, text = res.verdict(4)
    measured = float(re.search(r"zero2 peak = ([0-9.]+)x", text)[1])
    perfect = float(re.search(r"perfect ZeRO-2 would [a-z ]*?([0-9.]+)x", text)[1])
    assert holds is False and perfect <= measured, text
    # its parameters at the precision's bytes, its optimizer shard, that moment's activations
    states = {"fp32": (4, 8), "fp16": (2, 12)}[precision]
    least = params * states[0] + params * states[1] // 4 + zero2["activations"] + zero2["other"]
    assert perfect == math.floor(least / sum(ddp.values()) * 100) / 100
    res.memory["zero2"] = replace(res.memory["zero2"], mem_breakdown_bytes=None)
    assert "perfect" not in res.verdict(4)[1]


def test_a_ratio_beside_its_threshold_is_printed_on_its_side_of_it() -> None:
    """0.502x against "<= 0.5x" is not printed "0.50x" (a pass to the eye), nor a size bracket of
    1.996x against ">= 2x" "2.00x": digits are added until the printed value sides with the real."""
    res = WorkloadResult(ClaimWorkload("w", "p", 1))
    res.memory = {s: _record(s, p, {}, 1.0) for s, p in (("ddp", 1000), ("zero2", 502))}
    for s, fit, fail in (("ddp", 100000, 100100), ("zero2", 199800, 200600)):
        info = {"largest_fit": {"params": fit}, "smallest_fail": {"params": fail}}
        res.max_size[s] = replace(_record(s, 1, {}, 1.0), max_size=info)
    holds, text = res.verdict(8)
    assert holds is False and res.outcome(8) == "undecided"
    assert (
        "zero2 peak = 0.502x ddp" in text
        and "largest trainable = 1.998x ddp (between 1.996x and 2.01x" in text
    )
    spec = SPECS["tiny"]
    then = [
        replace(_record(s, p, {}, 1.0), workload="swav", preset="tiny", suite="claim-tiny", world_size=n)
        for s, p, n in (("ddp", 100, spec.world_size), ("zero2", 40, spec.world_size))
    ]
    now = replace(res, workload=ClaimWorkload("swav", "tiny", 2), max_size={})
    (change,) = compare_claims(spec, then, [now])
    assert change.moved.startswith("zero2/ddp peak 0.40x -> 0.502x")
    texts = [ratio_text(x, 0.5) for x in (0.502, 0.498, 0.5, 0.42, None)]
    assert texts == ["0.502x", "0.498x", "0.50x", "0.42x", "?"]
    assert ratio_text(1.9996, 2.0) == "1.9996x" and ratio_text(0.502) == "0.50x"  # no threshold: 2 digits


def test_claims_help_says_where_it_writes_and_each_specs_defaults(capsys) -> None:
    """The folder as ``cmd_claim`` names it, and --world-size's and --budget's defaults as the
    specs hold them (the tiny spec simulates N=4, not 8)."""
    with pytest.raises(SystemExit):
        main(["claim", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "<device>" not in text and "into results/claim/<spec>/ (-<workloads> added" in text
    assert "-<precision> away from fp32" in text.split("--out OUT")[-1]
    world, budget = text.split("--world-size WORLD_SIZE")[-1].split("--budget BUDGET")
    assert all(f"{name} {spec.world_size}" in world for name, spec in SPECS.items()) and "tiny 4" in world
    assert all(f"{name} {spec.budget}" in budget.split("--precision")[0] for name, spec in SPECS.items())


def test_the_committed_cpu_report_is_what_its_records_give_now(tmp_path: Path, monkeypatch) -> None:
    """results/claim/cpu/report.md (docs/claim.md states its numbers) is what the current code
    writes from its records, as ``claim --peers --from-records`` rebuilds it: peers' columns and
    lines included. Charts aside (their files are checked to exist)."""
    import shardbench.report.claim_report as claim_report
    from shardbench.cli.claim import REAL_PEERS, SIMULATED_PEERS
    from shardbench.studies.claim_result import every_variant
    from shardbench.studies.claim_specs import default_out

    committed = Path(__file__).resolve().parents[1] / "results" / "claim" / "cpu"
    report = (committed / "report.md").read_text()
    monkeypatch.setattr(claim_report, "build_report", lambda *_: type("R", (), {"charts": []}))
    spec = replace(SPECS["cpu"], peers=SIMULATED_PEERS, real_peers=REAL_PEERS)
    found = {
        r.workload.label: r for r in results_from_records(spec, read_records([committed / "records.jsonl"]))
    }
    monkeypatch.chdir(tmp_path)  # written where the committed one is, relative to here
    out = default_out(spec)
    out.mkdir(parents=True)
    rebuilt = write_claim_report(spec, every_variant(spec, found), out, None).read_text()
    assert rebuilt.split("## Charts")[0] == report.split("## Charts")[0]
    charts = re.findall(r"^!\[[^]]*\]\(([^)]+)\)$", report, flags=re.M)
    assert charts and all((committed / c).is_file() for c in charts)
