"""The command line: bad input is one line, exit 2, nothing written; list/env work."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shardbench.cli import main


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["run", "--workload", "nope"], "allowed: transformer"),
        (["run", "--strategy", "nope"], "allowed: dp, ddp"),
        (["run", "--suite", "nope"], "allowed: gpu-check, nightly-cpu, nightly-gpu, smoke"),
        (["run", "--preset", "huge"], "allowed: tiny"),
        (["run", "--world-size", "0"], "world size must be >= 1"),
        (["run", "--batch-size", "0"], "batch size must be >= 1"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(argv, needle, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not out.exists()


PLAN = ["plan", "--workload", "transformer", "--world-size", "2", "--budget", "1GiB"]
MAX_SIZE = [
    "max-size",
    "--workload",
    "transformer",
    "--strategy",
    "ddp",
    "--world-size",
    "2",
    "--budget",
    "1GiB",
]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            [*PLAN, "--gpu", "H100", "--device", "cpu"],
            "--gpu H100 names the GPU of a CUDA plan; --device cpu",
        ),
        ([*MAX_SIZE, "--vary", "batch", "--batch-size", "4"], "--batch-size shapes a --vary params search"),
        ([*MAX_SIZE, "--vary", "batch", "--resolution", "0.1"], "--resolution shapes a --vary params search"),
        ([*MAX_SIZE, "--vary", "batch", "--ladder", "tiny,small"], "--ladder shapes a --vary params search"),
        (
            [*MAX_SIZE, "--ladder", "tiny,small", "--preset", "tiny"],
            "--preset tiny (or --model-config) would be",
        ),
        (["claim", "--spec", "tiny", "--batch-size", "4"], "the spec's workloads (transformer"),
        (["claim", "--spec", "tiny", "--root", "elsewhere"], "--root is where --baseline is looked up"),
        (
            ["run", "--resume", "some-run", "--name", "again"],
            "goes on under that run's own name; drop --name",
        ),
        (
            ["run", "--workload", "transformer", "--fake", "--repeat", "3"],
            "--repeat 3 repeats timed cells, and --fake cells time nothing",
        ),
    ],
)
def test_a_flag_another_flag_would_leave_unused_is_refused(argv, needle, tmp_path, capsys) -> None:
    """A flag that would change nothing, given what the other flags say, is refused in one line
    before anything runs, rather than silently ignored."""
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_unreadable_suite_file(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("workloads = [")
    assert main(["run", "--suite", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "cannot read suite file" in capsys.readouterr().err
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("colour = 'blue'\n")
    assert main(["run", "--suite", str(unknown), "--out", str(tmp_path / "o")]) == 2
    assert "unknown key 'colour'" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without CUDA")
def test_cuda_without_cuda(tmp_path, capsys) -> None:
    assert main(["run", "--device", "cuda", "--out", str(tmp_path / "o")]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_list_json_is_valid_and_complete(capsys) -> None:
    assert main(["list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["workloads"]["transformer"]["presets"]["base"]["params"] == 109_483_778
    assert {"dp", "ddp"} <= set(data["strategies"])
    assert "smoke" in data["suites"]


def test_list_says_what_its_figures_count(capsys) -> None:
    """Each preset's figure is its parameter count, said where the list begins."""
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "workloads: presets (parameters)"
    assert "  transformer: tiny (0.6M), " in out


def test_list_imports_no_torch() -> None:
    """``shardbench list`` (and the CLI's import) reads declarations only: torch alone takes 2 s
    to import on the CI machine, and listing must answer in well under that."""
    code = (
        "import sys\nfrom shardbench.cli import main\nassert main(['list']) == 0\n"
        "print(sorted(m for m in ('torch', 'transformers', 'torchvision', 'torchaudio') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


def test_env_reports_versions(capsys) -> None:
    assert main(["env"]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["torch"] == torch.__version__ and env["gloo_available"] is True


def test_suites_shipped_are_valid() -> None:
    from shardbench.harness.config import load_suite, suite_names
    from shardbench.models.registry import get_workload
    from shardbench.strategies.registry import canonical_name

    for name in suite_names():
        cells = load_suite(name).cells()
        assert cells, name
        for c in cells:
            get_workload(c.workload).check_preset(c.preset)
            canonical_name(c.strategy)
    assert Path("bench/suites/smoke.toml").exists()


def test_dp_joins_the_default_suite_only_on_two_or_more_gpus() -> None:
    """DataParallel on the CPU or one GPU is a single-device run: the default suite leaves it
    out there, runs it on >= 2 GPUs, and a suite or a command line that names it keeps it."""
    from shardbench.cli import build_parser, resolve_cells
    from shardbench.harness.config import load_suite, override

    smoke = load_suite("smoke")
    assert "dp" not in smoke.strategies and smoke.multi_gpu_strategies == ("dp",)
    assert {c.strategy for c in smoke.for_devices(8).cells()} == {"ddp", "zero2"}  # its cells: CPU
    on_gpus = override(smoke, device="cuda")
    assert {c.strategy for c in on_gpus.for_devices(1).cells()} == {"ddp", "zero2"}
    assert {c.strategy for c in on_gpus.for_devices(2).cells()} == {"ddp", "zero2", "dp"}
    named = override(smoke, strategies=("dp", "ddp")).for_devices(0)
    assert [c.strategy for c in named.cells()][:2] == ["dp", "ddp"]
    assert "dp" in {c.strategy for c in load_suite("gpu-check").for_devices(1).cells()}
    if not torch.cuda.device_count() >= 2:
        _, cells = resolve_cells(build_parser().parse_args(["run"]))
        assert cells and "dp" not in {c.strategy for c in cells}


def test_suite_matrices_and_overrides(tmp_path) -> None:
    from shardbench.harness.config import load_suite, override

    path = tmp_path / "m.toml"
    path.write_text(
        'strategies = ["ddp"]\nworld_sizes = [2]\n'
        '[[matrix]]\nworkloads = ["transformer"]\npresets = ["tiny", "small"]\n'
        '[[matrix]]\nworkloads = ["imagegpt"]\npresets = ["tiny"]\nstrategies = ["ddp", "zero2"]\n'
    )
    spec = load_suite(str(path))
    got = [(c.workload, c.preset, c.strategy) for c in spec.cells()]
    assert got == [
        ("transformer", "tiny", "ddp"),
        ("transformer", "small", "ddp"),
        ("imagegpt", "tiny", "ddp"),
        ("imagegpt", "tiny", "zero2"),
    ]
    # a command-line list wins in every matrix
    assert {c.strategy for c in override(spec, strategies=("zero1",)).cells()} == {"zero1"}
    path.write_text("[[matrix]]\nworkload = ['x']\n")
    with pytest.raises(ValueError, match="unknown key 'workload'"):
        load_suite(str(path))


def test_no_help_states_a_switch_default_backwards() -> None:
    """``--no-charts`` draws charts unless given: its help must not end in "(default: True)"."""
    import argparse

    from shardbench.cli import build_parser

    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subs.choices.items():
        text = sub.format_help()
        assert "(default: True)" not in text and "(default: False)" not in text, name
    assert "--no-charts" in subs.choices["run"].format_help()


def test_a_run_is_named_after_what_ran(monkeypatch) -> None:
    """A run's name (its id and folder) is the suite's only where its cells are the suite's
    (narrowed or repeated by flags); where the flags replaced the suite's lists it is named
    after the workloads that ran, a file's model by the file; ``--name`` wins over both."""
    from types import SimpleNamespace

    from shardbench.cli import run as run_cli
    from shardbench.harness import bounded

    names: list[str] = []

    def execute(cells, *, name, **_):
        names.append(name)
        return SimpleNamespace(code=0)

    monkeypatch.setattr(run_cli, "execute_run", execute)
    monkeypatch.setattr(bounded, "check_workload", lambda *a, **k: None)  # no child: nothing runs
    mine = "examples/mymodel.py:factory"
    for argv in (
        [],
        ["--strategy", "ddp", "--workload", "swav", "--repeat", "2"],
        ["--workload", mine],
        ["--workload", f"{mine},swav", "--strategy", "zero1"],
        ["--workload", "swav", "--world-size", "1"],
        ["--world-size", "1"],
        ["--workload", mine, "--name", "mine"],
    ):
        assert main(["run", *argv]) == 0
    assert names == [
        "smoke",
        "smoke",
        "mymodel",
        "mymodel-swav",
        "swav",
        "transformer-imagegpt-and-2-more",
        "mine",
    ]
    assert [
        run_cli.workload_label(w) for w in ("hf:GPT2LMHeadModel", "pkg.models:build", "lightning:a/b.py:Lit")
    ] == [
        "GPT2LMHeadModel",
        "models",
        "b",
    ]


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("buffered", [False, True])
def test_a_closed_pipe_ends_the_command_quietly(buffered: bool) -> None:
    """``shardbench list | head -1``: the reader closing stdout is normal use, not a bug: no
    traceback, no "internal error", exit 141 (128 + SIGPIPE) as a shell reports it, whether the
    output met the closed pipe while printing (unbuffered) or when flushed at the end."""
    import os

    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env.update({} if buffered else {"PYTHONUNBUFFERED": "1"})
    try:
        done = subprocess.run(
            [sys.executable, "-m", "shardbench", "list"], stdout=write, stderr=subprocess.PIPE,
            text=True, env=env, timeout=60,
        )  # fmt: skip
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")


def test_a_broken_pipe_that_is_not_stdout_is_still_a_bug() -> None:
    """Only stdout's reader going away is normal: a broken pipe anywhere else (a rank's socket)
    is reported as the internal error it is."""
    code = (
        "import sys, shardbench.cli as cli\n"
        "def broken(args):\n"
        "    raise BrokenPipeError(32, 'Broken pipe')\n"
        "cli.cmd_list = broken\n"
        "sys.exit(cli.main(['list']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and "internal error (BrokenPipeError" in done.stderr


def test_a_suggested_command_names_the_program_as_it_was_started(monkeypatch, tmp_path) -> None:
    """After the README's set-up nothing is on PATH: a hint printed by ``.venv/bin/shardbench``
    says ``.venv/bin/shardbench``, by a script PATH finds plain ``shardbench``, by the module
    ``python -m shardbench``; every hint (the measure command, a baseline to save, ...) uses it."""
    from types import SimpleNamespace

    from shardbench.cli import build_parser
    from shardbench.studies.baselines import find_baseline
    from shardbench.studies.plan import measure_command
    from shardbench.wording import program

    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "shardbench").write_text("#!/bin/sh\n")
    (venv / "shardbench").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(sys, "argv", [".venv/bin/shardbench", "plan"])
    assert program() == ".venv/bin/shardbench"
    record = SimpleNamespace(world_size=2, activation_checkpointing=False, workload="transformer",
                             preset="tiny", precision="fp32", batch_size_per_rank=8)  # fmt: skip
    assert measure_command(record, ["deepspeed-zero2"]).startswith(".venv/bin/shardbench run --workload")
    with pytest.raises(ValueError, match=r"save one with: \.venv/bin/shardbench baseline save RUN"):
        find_baseline("nope", root=tmp_path)
    sub = next(a for a in build_parser()._actions if a.choices and "run" in a.choices).choices
    helps = " ".join(" ".join(sub[name].format_help().split()) for name in ("run", "claim"))
    assert "'.venv/bin/shardbench report RUN_DIR' draws them later" in helps  # run --no-charts
    assert "(.venv/bin/shardbench baseline save results/claim/cpu" in helps  # claim --baseline
    monkeypatch.setenv("PATH", str(venv))
    monkeypatch.setattr(sys, "argv", [str(venv / "shardbench"), "plan"])
    assert program() == "shardbench"
    monkeypatch.setattr(sys, "argv", [str(ROOT / "bench" / "__main__.py"), "plan"])
    assert program().endswith(" -m shardbench")
    monkeypatch.setattr(sys, "argv", ["/usr/bin/pytest"])  # not started as shardbench: its name
    assert program() == "shardbench"
