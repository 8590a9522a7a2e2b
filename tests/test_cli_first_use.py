"""A run whose DeepSpeed cells will compile DeepSpeed's CPU op first says so in one line before
they start (the wait would read as a hang), and says nothing once the op is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardbench.cli import main
from shardbench.cli.first_use import DEEPSPEED_CPU_OP, deepspeed_build_note
from shardbench.harness import runner
from tests.records import make_record

NOTE = "deepspeed: its CPU communication op is compiled before the first DeepSpeed cell"


@pytest.fixture
def extensions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pytest.importorskip("deepspeed")
    folder = tmp_path / "torch-extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(folder))
    return folder


def _built(extensions: Path) -> None:
    op = extensions / DEEPSPEED_CPU_OP
    op.mkdir(parents=True)
    (op / f"{DEEPSPEED_CPU_OP}.so").touch()


def test_the_note_is_said_only_where_the_op_will_be_built(extensions: Path) -> None:
    note = deepspeed_build_note(["ddp", "deepspeed-zero2"], "cpu")
    assert note is not None and note.startswith(NOTE) and str(extensions / DEEPSPEED_CPU_OP) in note
    assert deepspeed_build_note(["ddp", "zero2"], "cpu") is None  # no DeepSpeed cell
    assert deepspeed_build_note(["deepspeed-zero2"], "cuda") is None  # DeepSpeed builds no CPU op there
    _built(extensions)
    assert deepspeed_build_note(["deepspeed-zero2"], "cpu") is None


@pytest.mark.parametrize("built", [False, True])
def test_a_run_says_it_before_its_first_cell(
    built: bool, extensions: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    if built:
        _built(extensions)
    said_before: list[str] = []

    def stand_in(cell, *, run_id):
        said_before.append(capsys.readouterr().err)
        return make_record(run_id=run_id, strategy=cell.strategy, world_size=cell.world_size)

    monkeypatch.setattr(runner, "run_cell", stand_in)
    argv = ["run", "--workload", "transformer", "--strategy", "ddp,deepspeed-zero2", "--no-charts"]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 0
    assert (NOTE in " ".join(said_before[0].split())) is not built
    assert NOTE not in " ".join(capsys.readouterr().err.split())  # said once, before the cells
