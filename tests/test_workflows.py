"""The GitHub Actions workflows say what the project says: CI runs the README's test command (read
from README.md, so the two cannot drift), the nightly runs the gates it should, where it should,
and every ``shardbench`` command in them is a real subcommand with real flags of the parser.

A workflow is only exercised on GitHub; this is what can be checked without running one.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardbench.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def triggers(workflow: dict[str, Any]) -> dict[str, Any]:
    # YAML 1.1 (PyYAML) reads the bare key `on` as the boolean True
    return workflow.get("on", workflow.get(True)) or {}


def readme_test_command() -> str:
    """The command under "Run the tests" in README.md: its first indented (code) line."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Run the tests"))
    return next(line.strip() for line in lines[start + 1 :] if line.startswith("    "))


def runs(job: dict[str, Any]) -> list[str]:
    return [step["run"] for step in job["steps"] if "run" in step]


def step_using(job: dict[str, Any], action: str) -> dict[str, Any]:
    return next(step for step in job["steps"] if step.get("uses", "").startswith(f"{action}@"))


def shardbench_commands(script: str) -> Iterator[tuple[str, list[str]]]:
    """``(subcommand, [--flag, ...])`` for each ``shardbench ...`` or ``python -m shardbench.cli ...``
    in a ``run:`` script; a command ends at its line's end or at a shell operator."""
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
        for i, token in enumerate(tokens):
            if Path(token).name == "shardbench":
                rest = tokens[i + 1 :]
            elif token == "-m" and tokens[i + 1 : i + 2] == ["shardbench.cli"]:
                rest = tokens[i + 2 :]
            else:
                continue
            words: list[str] = []
            for word in rest:
                if word and all(c in "();<>|&" for c in word):
                    break
                words.append(word)
            assert words, f"a shardbench command without a subcommand: {line!r}"
            yield words[0], [w.split("=", 1)[0] for w in words[1:] if w.startswith("-")]


def check_command(parser: argparse.ArgumentParser, command: str, flags: list[str]) -> None:
    """``command`` is a subcommand of ``parser`` and each flag one of its options, spelled in
    full (argparse would accept an abbreviation; a workflow should not rely on it)."""
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert command in sub.choices, f"shardbench has no subcommand {command!r}; it has {sorted(sub.choices)}"
    known = sub.choices[command]._option_string_actions
    for flag in flags:
        assert flag in known, f"shardbench {command} has no option {flag}; it has {sorted(known)}"


def test_ci_runs_lint_and_the_readme_test_command_on_push_and_pull_request() -> None:
    ci = load("ci.yml")
    assert {"push", "pull_request"} <= set(triggers(ci))
    (job,) = ci["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest"
    python = step_using(job, "actions/setup-python")["with"]
    assert (str(python["python-version"]), python["cache"], python["cache-dependency-path"]) == (
        "3.11",
        "pip",
        "pyproject.toml",
    )
    steps = [r.strip() for r in runs(job)]
    assert steps[:2] == ["bash scripts/setup.sh", ".venv/bin/ruff check bench models tests"]
    assert readme_test_command() == "bash scripts/setup.sh && .venv/bin/python -m pytest"  # the parse
    assert readme_test_command() in steps


@pytest.mark.parametrize(
    "job_name, runner", [("nightly-cpu", "ubuntu-latest"), ("nightly-gpu", ["self-hosted", "gpu"])]
)
def test_nightly_job_gates_uploads_and_summarises(job_name: str, runner: Any) -> None:
    nightly = load("nightly.yml")
    on = triggers(nightly)
    assert "workflow_dispatch" in on and on["schedule"][0]["cron"]
    job = nightly["jobs"][job_name]
    assert job["runs-on"] == runner
    suite = job_name  # each job runs its own suite against the baseline of that name
    out = job["env"]["NIGHTLY_OUT"]
    assert out == "results/nightly/${{ github.run_id }}"
    (gate,) = [
        s for s in job["steps"] if any(c == "nightly" for c, _ in shardbench_commands(s.get("run", "")))
    ]
    words = shlex.split(gate["run"])
    assert words[words.index("--suite") + 1] == suite and words[words.index("--baseline") + 1] == suite
    assert words[words.index("--out") + 1] == "$NIGHTLY_OUT"
    assert "if" not in gate and not gate.get("continue-on-error")  # its exit code fails the job
    upload = step_using(job, "actions/upload-artifact")
    assert upload["if"] == "always()" and "${{ env.NIGHTLY_OUT }}" in upload["with"]["path"].splitlines()
    (summary,) = [s for s in job["steps"] if "$GITHUB_STEP_SUMMARY" in s.get("run", "")]
    assert summary["if"] == "always()"
    assert 'cat "$NIGHTLY_OUT/compare.md" >> "$GITHUB_STEP_SUMMARY"' in summary["run"]
    # the history of earlier nights comes from the cache and goes back even after a regression
    restore, save = step_using(job, "actions/cache/restore"), step_using(job, "actions/cache/save")
    assert restore["with"]["path"] == save["with"]["path"] == "results/history" and save["if"] == "always()"
    assert "results/history" in upload["with"]["path"].splitlines()


def test_nightly_cpu_times_the_micro_benchmarks_against_the_previous_night() -> None:
    job = load("nightly.yml")["jobs"]["nightly-cpu"]
    assert step_using(job, "actions/cache")["with"]["path"] == ".benchmarks"
    (bench,) = [r for r in runs(job) if "tests/benchmarks" in r]
    for flag in ("-n 0", "--benchmark-enable", "--benchmark-only", "--benchmark-autosave"):
        assert flag in bench
    # compared only when an earlier run is saved (the first night has none)
    assert "--benchmark-compare --benchmark-compare-fail=median:20%" in bench and "compgen -G" in bench


def test_every_shardbench_command_in_the_workflows_parses() -> None:
    parser = build_parser()
    found = [
        (command, flags)
        for name in ("ci.yml", "nightly.yml")
        for job in load(name)["jobs"].values()
        for script in runs(job)
        for command, flags in shardbench_commands(script)
    ]
    for command, flags in found:
        check_command(parser, command, flags)
    assert sorted(c for c, _ in found) == ["nightly", "nightly"]  # one gate per nightly job, none in ci


def test_the_command_check_catches_a_misspelled_flag_or_subcommand() -> None:
    parser = build_parser()
    ((command, flags),) = shardbench_commands('.venv/bin/shardbench report "$R" --outt x && echo --no')
    assert (command, flags) == ("report", ["--outt"])
    with pytest.raises(AssertionError, match="has no option --outt"):
        check_command(parser, command, flags)
    with pytest.raises(AssertionError, match="no subcommand 'reprot'"):
        check_command(parser, "reprot", [])
