"""What a person reads is whole: a failed cell's exception and first sentence, never cut, with
its traceback linked; lines broken at word and argument boundaries; no ``None`` or ``e+03`` in
a table; counts that agree with their nouns."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shardbench.report.plan_report import plan_markdown, table, wrap
from shardbench.report.tables import records_to_frame, to_markdown, write_tables
from shardbench.report.terminal import WIDTH, terminal_table
from shardbench.studies.plan import Plan, PlanRow
from shardbench.studies.plan_reserve import policy
from tests.records import make_record

SENTENCE = "NotImplementedError: MemTracker does not support memory tracking for multiple iterative calls."
ERROR = (
    f"rank 0 at step 0: {SENTENCE} Either use a single call or reset it between them.\n"
    'Traceback (most recent call last):\n  File "worker.py", line 1, in run\nNotImplementedError'
)
COMMAND = (
    "measured only on real ranks: deepspeed-zero2, measure with: shardbench run --workload "
    "examples/mymodel.py:factory --preset default --strategy deepspeed-zero2 --world-size 2 "
    "--precision fp32 --batch-size 1 (on 2 real ranks: --device cuda for 2 GPUs)"
)


def _failed(**kw):
    return make_record(strategy="zero3", status="error", error=ERROR, **kw)


def _joined(lines: list[str]) -> str:
    return " ".join(line.strip() for line in lines)


def test_a_failed_cell_reads_its_exception_and_first_sentence_whole(tmp_path: Path) -> None:
    """The terminal table, the plan table and plan.md carry the exception's type and its whole
    first sentence (wrapped, not cut); plan.md and the tables link the full traceback, written
    beside the records."""
    records = [make_record(strategy="ddp", peak_mem_bytes={"max": 1 << 20}), _failed()]
    text = terminal_table(records)
    assert max(map(len, text.splitlines())) <= WIDTH
    assert SENTENCE in re.sub(r"\s+", " ", _joined(text.splitlines()))
    assert "Either use" not in text  # the first sentence only

    plan = Plan(
        rows=tuple(PlanRow(r.strategy, r, 1 << 30) for r in records),
        budget=1 << 30,
        policy=policy("cpu"),
        batch=8,
    )
    columns, body = table(plan)
    assert body[1][columns.index("fits")] == f"error: rank 0 at step 0: {SENTENCE}"
    write_tables(records, tmp_path)
    link = re.search(r"\[traceback\]\((errors/[^)]+\.txt)\)", plan_markdown(plan, title_text="plan"))
    assert link, "plan.md links the traceback"
    assert (tmp_path / link.group(1)).read_text().startswith(ERROR.splitlines()[0] + "\nTraceback")
    assert link.group(1) in (tmp_path / "table.md").read_text()


def test_the_measure_command_never_breaks_inside_an_argument() -> None:
    """At any width, a line breaks between arguments: ``examples/mymodel.py:factory`` stays
    whole, and a flag keeps its value (``--batch-size 1``)."""
    for width in range(40, 121, 7):
        lines = wrap(COMMAND, width)
        assert max(map(len, lines)) <= width
        assert _joined(lines) == COMMAND
        assert any("examples/mymodel.py:factory" in line for line in lines), width
        assert any("--batch-size 1" in line for line in lines), width


def test_an_hf_preset_too_long_for_its_column_is_shortened_in_its_middle(tmp_path: Path) -> None:
    """An hf: preset is its config, items joined by colons: in the terminal table each row stays
    on one line, the preset keeping its first and last items around an ellipsis (rich folded it
    into 25-character pieces); table.md has it whole."""
    preset = ":".join(["n_embd=128:n_layer=4:n_head=4:vocab_size=8192:seq_len=64"] * 2)
    hf = {"workload": "hf:GPT2LMHeadModel", "preset": preset}
    records = [make_record(strategy=s, **hf) for s in ("ddp", "zero2")] + [_failed(**hf)]
    text = terminal_table(records)
    header, *lines = text.splitlines()
    assert max(map(len, text.splitlines())) <= WIDTH
    start, end = header.index("preset"), header.index("strategy")
    rows = lines[:3]
    assert all(line.startswith("hf:GPT2LMHeadModel ") for line in rows), rows
    shown = [line[start:end].strip() for line in rows]
    assert all(p.startswith("n_embd=128:") and p.endswith(":seq_len=64") and "…" in p for p in shown)
    assert SENTENCE in re.sub(r"\s+", " ", _joined(lines))  # the failed cell's error: whole, under the table
    write_tables(records, tmp_path)
    assert f"| {preset} |" in (tmp_path / "table.md").read_text()


def test_no_none_and_no_exponent_in_the_tables() -> None:
    """A peer's row has no searched batch ("-", not None); 2880 samples/s read 2880."""
    fast = make_record(samples_per_s=2880.0, step_time_s={"median": 0.01, "mad": 0.0})
    assert "2880" in terminal_table([fast]) and "e+" not in terminal_table([fast])
    skipped = make_record(strategy="deepspeed-zero2", status="skipped")
    rows = (PlanRow("ddp", fast, 1 << 30, max_batch=90), PlanRow("deepspeed-zero2", skipped, 1 << 30))
    columns, body = table(Plan(rows=rows, budget=1 << 30, policy=policy("cpu"), batch=None))
    assert [line[columns.index("max batch")] for line in body] == ["90", "-"]
    markdown = plan_markdown(
        Plan(rows=rows, budget=1 << 30, policy=policy("cpu"), batch=None), title_text="p"
    )
    assert "None" not in markdown and "None" not in to_markdown(records_to_frame([fast, skipped]))
    # a tiny model's MFU on a large device: a small fraction, still written out in digits
    tiny = make_record(samples_per_s=2880.0, flops_per_step={"model": 6.3e8, "hardware": 6.3e8}, mfu=6.3e-5)
    table_md = to_markdown(records_to_frame([tiny]))
    assert "0.000063" in table_md and "e-" not in table_md


def test_a_run_of_one_cell_says_one_cell(tmp_path: Path, capsys) -> None:
    from shardbench.cli import main

    argv = ["run", "--workload", "transformer", "--preset", "tiny", "--strategy", "ddp", "--world-size", "2"]
    assert main([*argv, "--fake", "--out", str(tmp_path / "run")]) == 0
    assert "1 cell run, 1 ok;" in capsys.readouterr().out


def test_a_progress_label_is_wrapped_not_cut() -> None:
    """rich ends a label longer than its column in "…": the strategy's name must survive."""
    from shardbench.harness.runner import _RichProgress

    label = "hf:GPT2LMHeadModel/n_embd=128:n_layer=4:n_head=4:vocab_size=8192:seq_len=64 fsdp2-zero2 N=2"
    with _RichProgress(1) as progress:
        progress.start(label)
        description = progress._bar.tasks[0].description
    room = progress._bar.console.width
    assert re.sub(r"\s", "", description) == re.sub(r"\s", "", label) and "…" not in description
    assert any("fsdp2-zero2 N=2" in line for line in description.splitlines())
    assert max(map(len, description.splitlines())) < room


def test_a_slow_start_is_said_on_the_terminal_and_in_the_record() -> None:
    """DeepSpeed building an op just in time took one cell 60 s for 3 steps of 62 ms: a setup
    or first step over 10 s is a note in the record and a line on the terminal."""
    from shardbench.harness.config import CellConfig
    from shardbench.harness.result import RankResult, build_record
    from shardbench.harness.runner import done_line

    cell = CellConfig(workload="transformer", preset="tiny", strategy="ddp", world_size=2, steps=3)

    def record(setup: float):
        results = [
            RankResult(rank=i, step_times=[0.06] * 3, startup_s={"setup": setup - i, "first_step": 0.5})
            for i in range(2)
        ]
        return build_record(cell, cell.world_plan(), results, run_id="r", wall_s=setup + 1, processes=2)

    slow, fast = record(55.0), record(4.0)
    assert slow.startup_s == {"setup": 55.0, "first_step": 0.5}  # the slowest rank's
    assert "slow start: setup (imports, process group, model, strategy) took 55 s" in slow.note
    assert "slow start: setup" in done_line(cell, slow)
    assert "slow start" not in (fast.note or "") and "slow start" not in done_line(cell, fast)


@pytest.mark.parametrize(
    ("first_step", "step", "slow"), [(27.0, 30.0, False), (41.0, 30.0, True), (11.0, 0.06, True)]
)
def test_a_first_step_is_a_slow_start_only_beyond_a_timed_step(
    first_step: float, step: float, slow: bool
) -> None:
    """igpt-s at N = 4 takes 30 s a step: its first warm-up step of 27 s is a step, not a cold
    start. A first step 10 s beyond the timed steps' median is one, whatever the step."""
    from shardbench.harness.config import CellConfig
    from shardbench.harness.result import RankResult, build_record
    from shardbench.harness.runner import done_line

    cell = CellConfig(workload="transformer", preset="tiny", strategy="ddp", world_size=2, steps=3)
    results = [
        RankResult(rank=i, step_times=[step] * 3, startup_s={"setup": 2.0, "first_step": first_step})
        for i in range(2)
    ]
    record = build_record(cell, cell.world_plan(), results, run_id="r", wall_s=100.0, processes=2)
    said = f"slow start: the first warm-up step took {first_step:.0f} s"
    assert (said in (record.note or "")) is slow
    assert (said in done_line(cell, record)) is slow


def test_env_names_every_package_a_record_can_name(capsys) -> None:
    import json
    from importlib import metadata

    from shardbench.cli import main

    assert main(["env"]) == 0
    packages = json.loads(capsys.readouterr().out)["packages"]
    assert set(packages) >= {"deepspeed", "fairscale", "lightning", "transformers"}
    for name, version in packages.items():
        try:
            assert version == metadata.version(name)
        except metadata.PackageNotFoundError:
            assert version == "not installed"


def test_a_long_line_is_printed_wrapped_at_the_terminals_width(monkeypatch, capsys) -> None:
    """max-size's and claim's lines are longer than a terminal: printed as they are, the
    terminal would break them inside a word."""
    from shardbench.wording import print_wrapped

    monkeypatch.setenv("COLUMNS", "60")
    print_wrapped(COMMAND)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) > 1 and max(map(len, lines)) <= 60
    assert _joined(lines) == COMMAND


def test_progress_into_a_log_is_the_cells_lines_alone(capsys) -> None:
    """Where stderr is no terminal (a log, a pipe), each finished cell is one line and nothing
    else: no bar, and no tail of a wrapped label ("fp32 b=8") on a line of its own."""
    from shardbench.harness.runner import _progress

    labels = [f"transformer/tiny {s} N=8 fp32 b=8 with a label long enough to wrap" for s in ("ddp", "zero2")]
    with _progress(len(labels)) as progress:
        for label in labels:
            progress.start(label)
            progress.done(f"{label}: ok (0.1s)")
    assert capsys.readouterr().err.splitlines() == [f"{label}: ok (0.1s)" for label in labels]
