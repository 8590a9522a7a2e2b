"""The README's example of planning your own model runs as written (``examples/mymodel.py``),
its cells run in this process (the launcher is tested elsewhere)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shardbench.cli import main
from shardbench.harness import runner
from shardbench.records import read_records
from shardbench.studies.plan import PLAN_STRATEGIES, UNPLANNED, plannable
from tests.cells import run_cell_here

ROOT = Path(__file__).resolve().parents[1]


def test_readme_plan_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    readme = (ROOT / "README.md").read_text()
    (command,) = re.findall(
        r"^ {4}\.venv/bin/shardbench (plan --workload examples/mymodel\.py:factory .*)$", readme, re.M
    )
    monkeypatch.chdir(ROOT)  # the example's path is relative to the checkout
    monkeypatch.setattr(runner, "run_cell", lambda cell, *, run_id: run_cell_here(cell, run_id=run_id))
    assert main([*command.split()[0:], "--out", str(tmp_path / "plan")]) == 0
    records = read_records([tmp_path / "plan"])
    assert sorted(r.strategy for r in records) == sorted(PLAN_STRATEGIES)
    assert all(r.params == 7_361_536 for r in records)
    # every strategy keeps its row: the peers that cannot be a simulated rank say so
    assert {r.strategy for r in records if r.status != "ok"} == {
        s for s in PLAN_STRATEGIES if not plannable(s)
    }
    assert all(r.status == "skipped" and UNPLANNED in r.note for r in records if r.status != "ok")
    assert "recommended: " in capsys.readouterr().out


#: where a user reads commands to type: the README and every page of docs/
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: a command's program, as a code line or span starts it (after a prompt, the command before
#: an ``&&`` or variables): the installed script by any path, or ``-m shardbench`` (torchrun, srun)
_PROGRAM = re.compile(
    r"^(?:\$ )?(?:.*&& )?(?:[A-Z_]+=\S+ )*"
    r"(?P<program>\S*shardbench|.*-m shardbench(?:\.cli)?)\s(?P<rest>.*)$"
)
#: what marks a usage synopsis rather than a command: optional or alternative parts, an ellipsis
_SYNOPSIS = re.compile(r"\[|\.\.|…|<")


def documented_commands() -> list[tuple[str, str, str]]:
    """``(where, program, arguments)`` of every shardbench command in ``DOC_FILES``: each code
    line (indented four spaces, or within a fenced block; a line ending in a backslash goes on
    in the next) and each code span (which may run over a line break) that starts with one;
    headings name commands, not run them, and are left out."""
    found = []
    for path in DOC_FILES:
        prose, code, fenced, going_on = [], set(), False, None
        for number, line in enumerate(path.read_text().split("\n")):
            if line.startswith("```"):
                fenced, line = not fenced, ""
            elif going_on is not None:  # a shell line continued
                prose[going_on] = prose[going_on][:-1] + " " + line.strip()
                going_on = going_on if line.endswith("\\") else None
                line = ""
            elif fenced or line.startswith("    "):
                code.add(number)
                going_on = number if line.endswith("\\") else None
            elif re.match(r"#{1,6} ", line):
                line = ""
            prose.append(line)
        for number in sorted(code):
            if m := _PROGRAM.match(prose[number].strip()):
                found.append((f"{path.relative_to(ROOT)}:{number + 1}", m["program"], m["rest"]))
            prose[number] = ""
        text = "\n".join(prose)
        for span in re.finditer(r"`([^`]+)`", text):
            if m := _PROGRAM.match(" ".join(span[1].split())):
                number = text.count("\n", 0, span.start()) + 1
                found.append((f"{path.relative_to(ROOT)}:{number}", m["program"], m["rest"]))
    return found


def test_the_docs_commands_are_found() -> None:
    """The search above sees code lines, spans over a line break, prompts and variables."""
    found = [
        (where.split(":")[0], program, rest.split("#")[0].strip())
        for where, program, rest in documented_commands()
    ]
    assert ("README.md", ".venv/bin/shardbench", "run") in found  # after a prompt, and after an &&
    spanned = "max-size --workload transformer --strategy ddp,zero2,zero3 --world-size 8 --fake --budget 2GiB"
    assert ("docs/strategies.md", ".venv/bin/shardbench", f"{spanned} --batch-size 1") in found  # 2 lines
    assert ("docs/measuring.md", ".venv/bin/shardbench", "run --strategy zero2") in found  # after a variable
    continued = [r for _, p, r in found if p.startswith("torchrun") and p.endswith("-m shardbench")]
    assert continued == ["nightly --suite nightly-2x8.toml  --rules bench/suites/rules/nightly-gpu.toml"]
    assert len(found) > 40


def test_every_documented_command_runs_from_a_fresh_clone() -> None:
    """After the README's set-up (``bash scripts/setup.sh``) nothing is on PATH: a command that
    starts with a bare ``shardbench`` is "command not found". The installed script is
    ``.venv/bin/shardbench``; ``python -m shardbench`` is how torchrun and srun start it."""
    bare = [
        f"{where}: {program} {rest}"
        for where, program, rest in documented_commands()
        if program == "shardbench"
    ]
    assert not bare, "\n".join(bare)


def test_every_documented_command_parses() -> None:
    """Each command the docs give (not a usage synopsis) is accepted by the CLI's own parser, as
    typed: a required flag left out, a misspelled one or a value of the wrong kind fails here.
    Nothing is run."""
    import contextlib
    import io
    import shlex

    from shardbench.cli import build_parser

    refused = []
    for where, _, rest in documented_commands():
        words = []
        for word in shlex.split(rest, comments=True):
            if word in ("&&", "||", "|", ";", "\\"):
                break
            words.append(word)
        if _SYNOPSIS.search(rest.split("#")[0]) or len(words) < 2 or words[0].isupper():
            continue  # a synopsis, a placeholder (COMMAND), or a subcommand named in prose
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
                build_parser().parse_args(words)
        except SystemExit as e:
            if e.code:
                why = said.getvalue().strip().splitlines()[-1]
                refused.append(f"{where}: shardbench {' '.join(words)}\n  {why}")
    assert not refused, "\n".join(refused)
