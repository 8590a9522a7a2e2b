"""A workload of one's own is checked in a child under the cell's timeout: a hang is one line
naming where it hung, an exit of the process is an error naming its code, an absurd hf shape is
refused from its config alone; nothing runs and nothing is written."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shardbench.cli import main


def _run(tmp_path: Path, *argv: str) -> int:
    out = tmp_path / "out"
    code = main(["run", *argv, "--strategy", "ddp", "--world-size", "2", "--out", str(out)])
    assert not out.exists()
    return code


@pytest.mark.parametrize(
    ("factory", "where"),
    [("sleeps", "in sleeps ("), ("build_sleeps", "in <lambda> (")],
)
def test_a_factory_or_build_that_hangs_is_stopped_at_the_timeout(
    factory: str, where: str, tmp_path: Path, capsys
) -> None:
    start = time.monotonic()
    assert _run(tmp_path, "--workload", f"tests.user_models:{factory}", "--timeout", "2") == 2
    took = time.monotonic() - start
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "after 2 s (the cell's --timeout)" in err and where in err and "user_models.py" in err, err
    assert took < 30, took  # the timeout, a stack dump and the fork server's start; never the hour


def test_user_code_that_ends_the_process_is_an_error_naming_its_code(tmp_path: Path, capsys) -> None:
    assert _run(tmp_path, "--workload", "tests.user_models:ends_process", "--timeout", "60") == 2
    err = capsys.readouterr().err.strip()
    assert "ended the process with exit code 3" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ("n_layer=100000", "100,000 layers is over the 4,096"),
        ("n_embd=1000000", "parameters (from its config)"),
    ],
)
def test_an_absurd_hf_shape_is_refused_from_its_config(
    config: str, needle: str, tmp_path: Path, capsys
) -> None:
    argv = ["--workload", "hf:GPT2LMHeadModel", "--model-config", config, "--fake", "--timeout", "20"]
    assert _run(tmp_path, *argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err


def test_plan_and_max_size_bound_user_code_too(tmp_path: Path, capsys) -> None:
    common = ["--workload", "tests.user_models:build_sleeps", "--budget", "1GiB", "--timeout", "1"]
    assert main(["plan", *common, "--world-size", "2", "--out", str(tmp_path / "p")]) == 2
    assert "still checking" in capsys.readouterr().err
    argv = [
        "max-size",
        *common,
        "--fake",
        "--strategy",
        "ddp",
        "--world-size",
        "2",
        "--out",
        str(tmp_path / "m"),
    ]
    assert main(argv) == 2
    assert "still checking" in capsys.readouterr().err
    assert not (tmp_path / "p").exists() and not (tmp_path / "m").exists()
