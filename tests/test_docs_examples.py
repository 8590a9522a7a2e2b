"""The commands the examples' docstrings give run as written after the set-up: each starts with
``.venv/bin/shardbench`` (nothing is on PATH after ``bash scripts/setup.sh``) and parses."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

from shardbench.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
#: a command in a docstring: a code line, or a ``span``, that starts with the program
COMMAND = re.compile(r"(?:^\s+|``)((?:\S*/)?shardbench [a-z][^`\n]*)", re.M)


def example_commands() -> list[tuple[str, str]]:
    """``(file, command)`` of each shardbench command the examples' docstrings give."""
    found = []
    for path in sorted((ROOT / "examples").glob("*.py")):
        text = path.read_text()
        doc = text[: text.index('"""', 3) + 3] if text.startswith('"""') else ""
        for m in COMMAND.finditer(doc.replace("\\\n", " ")):  # a shell line continued
            found.append((path.name, " ".join(m[1].split())))
    return found


def test_the_examples_commands_name_the_installed_program_and_parse() -> None:
    commands = example_commands()
    assert {name for name, _ in commands} == {"mymodel.py", "lightning_gpt.py"}
    assert [c for _, c in commands if not c.startswith(".venv/bin/shardbench ")] == []
    refused = []
    for name, command in commands:
        words = shlex.split(command)[1:]
        with contextlib.redirect_stderr(io.StringIO()) as said, contextlib.redirect_stdout(io.StringIO()):
            try:
                build_parser().parse_args(words)
            except SystemExit as e:
                if e.code:
                    refused.append(f"{name}: {command}: {said.getvalue().strip()}")
    assert refused == []
