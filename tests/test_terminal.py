"""What a person reads in the terminal: the compact table (at most 120 columns, the columns
chosen), the flag legend, the ratio lines against ddp; ``--version`` and defaults in ``--help``."""

from __future__ import annotations

import argparse
import re
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from shardbench.cli import build_parser, main
from shardbench.records import read_records
from shardbench.report.tables import write_tables
from shardbench.report.terminal import (
    COLUMNS,
    DEFAULT_COLUMNS,
    SHORTENED,
    WIDTH,
    check_columns,
    flags,
    middle_ellipsis,
    ratio_lines,
    terminal_table,
)

SAMPLES = Path(__file__).resolve().parents[1] / "results" / "samples"


@pytest.fixture(scope="module")
def records():
    found = read_records([SAMPLES])
    assert found, "results/samples/ holds the sample records"
    return found


def test_no_line_wider_than_120(records) -> None:
    text = terminal_table(records)
    assert max(len(line) for line in text.splitlines()) <= WIDTH
    assert "workload" in text.splitlines()[0]


def test_columns_are_chosen(records) -> None:
    header = terminal_table(records, ("peak", "strategy")).splitlines()[0].split()
    chosen = header.index("peak")
    assert header[0] == "workload"
    assert header[chosen:] in (["peak", "strategy"], ["peak", "strategy", "error"])  # error: failed cells
    assert set(header[1:chosen]) <= {"preset", "N", "prec", "batch", "flags"}  # what the samples differ in
    with pytest.raises(ValueError, match="allowed: workload"):
        check_columns(["strategy", "colour"])
    assert set(check_columns(list(COLUMNS))) == set(COLUMNS)


def test_chosen_columns_keep_what_names_each_row(records) -> None:
    """--columns that leave out the workload, the strategy or what the rows differ in (here N)
    still show them: no two rows of the table read alike, and each says which cell it is."""
    ok = [r for r in records if r.status == "ok"]
    ddp = next(r for r in ok if r.strategy == "ddp")
    cells = [replace(ddp, strategy=s, world_size=n) for s in ("ddp", "zero2") for n in (2, 4)]
    header, *rows = terminal_table(cells, ("peak",)).splitlines()[: 1 + len(cells)]
    assert header.split()[:3] == ["workload", "strategy", "N"] and header.split()[-1] == "peak"
    assert len({tuple(row.split()[:3]) for row in rows}) == len(cells)
    same_n = terminal_table(cells[::2], ("MFU",)).splitlines()[0].split()
    assert same_n == ["workload", "strategy", "MFU"]  # N is the same in every row: not added


def test_flags_and_legend(records) -> None:
    r = records[0]
    simulated = replace(r, simulated=True, fake=True, activation_checkpointing=True)
    assert flags(simulated) == "S F AC"
    single = replace(
        r, simulated=False, fake=False, activation_checkpointing=False, world_size=1, requested_world_size=4
    )
    assert flags(single) == "1"
    text = terminal_table([simulated, single])
    assert "S = simulated" in text and "1 = single-device" in text and "AC = activation" in text


def test_ratio_lines_against_ddp(records) -> None:
    ok = [r for r in records if r.status == "ok"]
    ddp = next(r for r in ok if r.strategy == "ddp")
    half = replace(
        ddp, strategy="zero2", peak_mem_bytes={**ddp.peak_mem_bytes, "max": ddp.peak_mem_bytes["max"] // 2}
    )
    (line,) = ratio_lines([ddp, half])
    assert line.startswith(f"{ddp.workload} {ddp.preset} N={ddp.world_size} {ddp.precision} ")
    assert "vs ddp: zero2: 0.50x peak" in line
    if ddp.step_time_s:
        assert "1.00x step time" in line


def test_repeats_say_which_repeat_a_row_is(records, tmp_path) -> None:
    """run --repeat 2: the table, table.md, table.csv and the ratio lines say which repeat each
    row is, and each repeat of a strategy is set against ddp's repeat of the same round."""
    ddp = next(r for r in records if r.status == "ok" and r.strategy == "ddp")
    peak = ddp.peak_mem_bytes["max"]
    cells = [
        replace(ddp, repeat=i, strategy=s, peak_mem_bytes={**ddp.peak_mem_bytes, "max": peak // d})
        for i, d in ((0, 2), (1, 4))
        for s, d in (("ddp", 1), ("zero2", d))
    ]
    text = terminal_table(cells)
    header, *rows = text.splitlines()[:5]
    assert header.split()[:4] == ["workload", "preset", "strategy", "repeat"]
    assert [row.split()[2:4] for row in rows] == [["ddp", "0"], ["ddp", "1"], ["zero2", "0"], ["zero2", "1"]]
    lines = [line for line in ratio_lines(cells) if not line.startswith("  ")]  # each wraps once
    assert [("repeat 0" in line, "repeat 1" in line) for line in lines] == [(True, False), (False, True)]
    assert "zero2: 0.50x peak" in lines[0] and "zero2: 0.25x peak" in lines[1]
    write_tables(cells, tmp_path)
    assert "| strategy | repeat |" in (tmp_path / "table.md").read_text()
    assert list(pd.read_csv(tmp_path / "table.csv")["repeat"]) == [0, 1, 0, 1]
    assert "repeat" not in terminal_table([ddp]).splitlines()[0]  # one repeat: no column


def test_run_columns_flag_is_validated(tmp_path, capsys) -> None:
    assert main(["run", "--columns", "strategy,colour", "--out", str(tmp_path / "o")]) == 2
    assert "--columns: unknown column 'colour'" in capsys.readouterr().err


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("shardbench ")


def test_help_shows_defaults() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and "run" in a.choices).choices
    assert "(default: 8)" in sub["plan"].format_help()
    assert "(default: smoke)" in sub["run"].format_help()
    assert "results/claim/<spec>/" in sub["claim"].format_help()


def _subcommands(parser, path=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield (*path, name), child
                yield from _subcommands(child, (*path, name))


#: options that do nothing when absent (so they have no default to show)
OFF_WHEN_ABSENT = {"--tag", "--resume", "--ladder", "--baseline", "--rules", ("claim", "--workload")}


def test_every_subcommand_says_what_it_is_for_and_shows_its_defaults(monkeypatch) -> None:
    """Each subcommand, at any depth, has a description, and each option's help shows its
    default: the value where it has one, in words ("default: the suite's") where it has none."""
    monkeypatch.setenv("COLUMNS", "100")
    walked = list(_subcommands(build_parser()))
    commands = {path[0] for path, _ in walked}
    assert commands >= {"run", "plan", "report", "nightly", "trend", "export", "list", "env"}
    for path, parser in walked:
        assert parser.description, f"shardbench {' '.join(path)} has no description"
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction) or action.required:
                continue
            flag, default = action.option_strings[-1], action.default
            if isinstance(default, list | tuple) and default:
                assert ",".join(map(str, default)) in text, (path, flag)
            elif isinstance(default, bool):  # a switch: "(default: True)" would read backwards
                assert f"default: {default}" not in text.split(flag, 1)[1].split(" --", 1)[0], (path, flag)
            elif default not in (None, False, [], ()):
                assert f"default: {default}" in text or f"default {default}" in text, (path, flag)
            elif action.nargs != 0 and flag not in OFF_WHEN_ABSENT and (path[0], flag) not in OFF_WHEN_ABSENT:
                assert "default" in (action.help or ""), (path, flag, "says nothing of what absent means")


@pytest.mark.parametrize("columns", ["80", "100", "120"])
def test_help_never_breaks_a_name_across_lines(monkeypatch, columns) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    for path, parser in _subcommands(build_parser()):
        for line in parser.format_help().splitlines():
            assert not re.search(r"\w-$", line), (path, line)


def test_a_list_of_choices_is_refused_by_the_parser(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["run", "--precision", "fp32,fp8"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "invalid choice: 'fp8' (choose from fp32, bf16" in err
    assert build_parser().parse_args(["run", "--precision", "fp32,bf16"]).precision == ("fp32", "bf16")


def test_mfu_column_and_the_peak_it_is_set_against(records) -> None:
    ok = next(r for r in records if r.status == "ok" and r.step_time_s)
    peak = {"flops_per_s": 2.09e11, "kind": "measured", "dtype": "fp32", "device_name": "Xeon", "threads": 1}
    counted = replace(
        ok,
        mfu=0.00426,
        achieved_flops_per_s={"model": 8.9e8, "hardware": 8.9e8},
        peak_flops_per_s=peak,
        predicted_step_time={"step": ok.step_time_s["median"] * 1.1, "network": "gloo"},
    )
    assert DEFAULT_COLUMNS[-2:] == ("MFU", "pred/meas")
    text = terminal_table([counted, replace(ok, strategy="zero2")], (*DEFAULT_COLUMNS, "TFLOP/s"))
    header, row, other = text.splitlines()[:3]
    assert header.split()[-3:] == ["MFU", "pred/meas", "TFLOP/s"]
    assert row.split()[-3:] == ["0.426%", "1.10", "0.00089"]
    assert "predicted step time: median absolute error 10% over 1 cell (network gloo" in text
    assert other.split()[-1] not in ("0.426%", "0.00089")  # a record without a count: blank cells
    assert (
        "MFU against 0.209 TFLOP/s, the measured peak of Xeon at fp32, 1 thread (docs/measuring.md)" in text
    )


def test_every_header_shown_is_the_key_that_chooses_it(records) -> None:
    """What a person reads above a column is what they type to --columns (any case; the older
    keys still answer), and the table shows by default the columns --help lists as its default."""
    every = [r for r in records if r.status == "ok"][:1]
    every = [replace(every[0], predicted_step_time={"step": 0.01, "network": "gloo"})]
    shown = terminal_table(every, list(COLUMNS)).splitlines()[0].split()
    assert shown == list(COLUMNS)  # no header has a space: one word each, as typed
    assert check_columns(shown) == tuple(shown)
    assert check_columns(["workload", "pred/meas", "mfu", "Samples/S"]) == (
        "workload",
        "pred/meas",
        "MFU",
        "samples/s",
    )
    assert check_columns(["step/pred", "throughput", "comm", "step", "precision"]) == (
        "pred/meas",
        "samples/s",
        "sent/step",
        "step",
        "prec",
    )
    assert terminal_table(every).splitlines()[0].split() == list(DEFAULT_COLUMNS)


def test_tokens_per_second_reads_per_rank_and_for_the_whole_job() -> None:
    """tokens/s per rank (a GPU on CUDA, as torchtitan, Megatron and llm-foundry report it) and
    all ranks together, each under its own label, in the terminal and in the table's frame;
    ``tokens/s``, the older key, chooses the whole job's."""
    from shardbench.report.tables import records_to_frame

    flops = {"model": 1e9, "hardware": 1e9, "tokens_per_sample": 16, "dtype": "fp32"}
    cell = _timed(world_size=4, flops_per_step=flops, tokens_per_s=320.0 * 16)
    assert check_columns(["tokens/s"]) == ("tokens/s/job",)
    header, row = terminal_table([cell], ("strategy", "tokens/s/rank", "tokens/s/job")).splitlines()[:2]
    assert header.split() == ["workload", "strategy", "tokens/s/rank", "tokens/s/job"]
    assert row.split() == [cell.workload, "ddp", "1.28K", "5.12K"]
    frame = records_to_frame([cell])  # the data keeps the figures whole
    assert "tokens_per_s" not in frame.columns
    assert frame[["tokens_per_s_per_rank", "tokens_per_s_job"]].iloc[0].tolist() == [1280, 5120]


def test_tokens_per_second_reads_compact_as_the_plan_shows_it() -> None:
    """A GPU job's tokens/s runs to millions: ``51.5M`` and ``6.44M``, as the plan's columns
    read, never ``51545091``."""
    flops = {"model": 1e9, "hardware": 1e9, "tokens_per_sample": 2048, "dtype": "bf16"}
    cell = _timed(world_size=8, flops_per_step=flops, tokens_per_s=51_545_091.0)
    row = terminal_table([cell], ("strategy", "tokens/s/rank", "tokens/s/job")).splitlines()[1]
    assert row.split() == [cell.workload, "ddp", "6.44M", "51.5M"]


def test_the_help_lists_the_default_columns_the_table_shows(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    sub = next(a for a in build_parser()._actions if a.choices and "run" in a.choices).choices
    text = " ".join(sub["run"].format_help().split())
    listed = re.search(r"--columns COLUMNS .*?default: (\S+); also: (\S+)", text)
    assert listed, text
    assert tuple(listed.group(1).split(",")) == DEFAULT_COLUMNS
    assert set(listed.group(2).split(",")) == set(COLUMNS) - set(DEFAULT_COLUMNS)


def test_the_run_command_takes_the_header_it_shows(tmp_path, capsys) -> None:
    """--columns is checked before anything runs: a header is taken (the run then fails on the
    workload, the next thing checked), a name that is no header is refused."""
    argv = ["run", "--workload", "nope", "--out", str(tmp_path / "o")]
    assert main([*argv, "--columns", "workload,pred/meas,step,samples/s,MFU"]) == 2
    assert "unknown workload" in capsys.readouterr().err


LONG = "lightning:examples/lightning_gpt.py:GPTLit"  # docs/lightning.md's


def test_a_long_workload_name_keeps_each_row_on_one_line(tmp_path) -> None:
    """At 120 columns, a lightning: name too long for its column is shortened in its middle
    (its start and its class name kept) and its row stays on one line; table.md has it whole."""
    from tests.records import make_record

    cells = [
        make_record(
            workload=LONG,
            preset="default",
            strategy=s,
            simulated=sim,
            peak_mem_bytes={"max": 123_456_789},
            step_time_s={"median": 0.0312, "mad": 0.0011},
            samples_per_s=512.0,
            mfu=0.0978,
            predicted_step_time={"step": 0.03, "network": "gloo"},
        )
        for s in ("ddp", "zero2", "fsdp2-zero3")
        for sim in (False, True)
    ]
    text = terminal_table(cells)
    lines = text.splitlines()
    header, rows = lines[0], lines[1 : 1 + len(cells)]
    assert header.split() == list(DEFAULT_COLUMNS)
    assert all(row.startswith("lightning") and "…" in row.split()[0] for row in rows), rows
    assert all(row.split()[0].endswith(":GPTLit") for row in rows), rows
    assert max(map(len, lines)) <= WIDTH
    assert lines[1 + len(cells)] == SHORTENED  # not a row: what the ellipsis means
    assert {row.split()[2] for row in rows} == {"ddp", "zero2", "fsdp2-zero3"}
    write_tables(cells, tmp_path)
    assert f"| {LONG} |" in (tmp_path / "table.md").read_text()


def test_a_name_that_fits_is_not_shortened(records) -> None:
    assert "…" not in terminal_table(records) and SHORTENED not in terminal_table(records)
    assert middle_ellipsis("abcdefghij", 7) == "abc…hij" and middle_ellipsis("abc", 7) == "abc"


def _timed(**overrides):
    from tests.records import make_record

    return make_record(**{"step_time_s": {"median": 0.05, "mad": 0.001}, "samples_per_s": 320.0, **overrides})


def test_a_blank_figure_says_why_under_the_table() -> None:
    """An ok row whose MFU, TFLOP/s or pred/meas is blank says why under the table, once per
    reason, in the record's own words: a count torch refused (its reason whole, "; " inside its
    parenthesis and all), a peak that could not be had, a simulated row's throughput."""
    flops = {"model": 1e9, "hardware": 1e9, "tokens_per_sample": 16, "dtype": "fp32"}
    refused = "FLOPs not counted (AssertionError: shapes are incompatible; heads 4 and 2)"
    cells = [
        _timed(strategy="ddp", note=f"slow start: import 9 s; {refused}"),
        _timed(strategy="zero2", note=refused),
        _timed(
            strategy="zero3",
            flops_per_step=flops,
            achieved_flops_per_s={"model": 2e10, "hardware": 2e10},
            note="no peak FLOP/s (RuntimeError: the probe failed)",
        ),
        _timed(
            strategy="fsdp2-zero3",
            flops_per_step=flops,
            achieved_flops_per_s={"model": 2e10, "hardware": 2e10},
            peak_flops_per_s={
                "flops_per_s": 1e11,
                "kind": "measured",
                "dtype": "fp32",
                "device_name": "Xeon",
            },
            mfu=0.2,
            predicted_step_time={"step": 0.05, "network": "gloo"},
        ),
        _timed(strategy="ddp", world_size=8, simulated=True, samples_per_s=None, note=refused),
    ]
    text = terminal_table(cells, (*DEFAULT_COLUMNS, "TFLOP/s")).replace("\n  ", " ")
    assert f"MFU, pred/meas, TFLOP/s blank for ddp N=2, zero2 N=2: {refused}" in text, text
    assert f"MFU, TFLOP/s blank for ddp N=8: {refused}" in text
    assert "MFU blank for zero3 N=2: no peak FLOP/s (RuntimeError: the probe failed)" in text
    assert "pred/meas blank for zero3 N=2: no step time predicted" in text
    assert (
        "samples/s, pred/meas blank for ddp N=8: simulated: its step time has no communication in it" in text
    )
    # a row with every figure: named in no such line
    assert not [line for line in text.splitlines() if "blank for" in line and "fsdp2-zero3" in line]
    # a cell whose error says what went wrong, or a fake cell's flag (nothing timed): no line
    failed = _timed(strategy="zero2", status="error", error="RuntimeError: boom", note=refused)
    fake = _timed(strategy="zero2", fake=True, step_time_s=None, samples_per_s=None, note=refused)
    assert "blank for" not in terminal_table([failed, fake])


def test_each_peak_line_says_which_rows_it_is_set_against() -> None:
    """run --scaling on a CPU: N=1's rank has every thread, each of N=2's ranks half, so their
    MFUs are set against two peaks: each line names the rows it holds for."""

    def peak(tflops: float, threads: int) -> dict:
        return {
            "flops_per_s": tflops * 1e12,
            "kind": "measured",
            "dtype": "fp32",
            "device_name": "Xeon",
            "threads": threads,
        }

    two, one = peak(0.342, 2), peak(0.169, 1)
    cells = [
        _timed(strategy=s, world_size=n, mfu=0.1, peak_flops_per_s=p)
        for s, n, p in (("ddp", 1, two), ("ddp", 2, one), ("zero2", 2, one))
    ]
    text = terminal_table(cells)
    assert (
        "MFU at N=1 against 0.342 TFLOP/s, the measured peak of Xeon at fp32, 2 threads (docs/measuring.md)"
        in text
    )
    assert (
        "MFU at N=2 against 0.169 TFLOP/s, the measured peak of Xeon at fp32, 1 thread (docs/measuring.md)"
        in text
    )
    # told apart by precision where the world sizes do not, by the rows themselves where neither
    bf16 = [*cells[1:], _timed(strategy="ddp", precision="bf16", mfu=0.1, peak_flops_per_s=two)]
    assert {
        line.split(" against ")[0] for line in terminal_table(bf16).splitlines() if " against " in line
    } == {
        "MFU at fp32",
        "MFU at bf16",
    }
    mixed = [cells[1], replace(cells[2], peak_flops_per_s=two)]
    lines = [line for line in terminal_table(mixed).splitlines() if " against " in line]
    assert [line.split(" against ")[0] for line in lines] == [
        "MFU of transformer tiny ddp N=2 fp32",
        "MFU of transformer tiny zero2 N=2 fp32",
    ]
