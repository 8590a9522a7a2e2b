"""Text a person reads in the terminal, laid out one way in every command: lines broken at word
and argument boundaries, counts that agree with their nouns, and an error's first sentence.

A line breaks only between words, so a suggested command never splits inside an argument
(``examples/mymodel.py:factory`` stays whole); only a word longer than a whole line is broken,
after one of its separators (``n_embd=128,n_layer=4:...`` after a comma or a colon), never inside
a name or a number.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from pathlib import Path

#: where a word too long for a line may break: after these (a model config's separators, a path's)
_SEPARATORS = re.compile(r"(?<=[,:;/])")


def _pieces(word: str, width: int) -> list[str]:
    """``word`` in pieces of at most ``width``, broken after its separators (a piece with none
    is cut at ``width``, the one case a name can break)."""
    if len(word) <= width:
        return [word]
    pieces, piece = [], ""
    for part in _SEPARATORS.split(word):
        while len(part) > width:  # no separator within reach
            if piece:
                pieces.append(piece)
                piece = ""
            pieces.append(part[:width])
            part = part[width:]
        if piece and len(piece) + len(part) > width:
            pieces.append(piece)
            piece = ""
        piece += part
    return [*pieces, piece] if piece else pieces


def _units(text: str) -> list[str]:
    """The words of ``text``, an option kept with its value (``--batch-size 1``): a command's
    argument is never split from its flag."""
    units: list[str] = []
    for word in text.split():
        if units and units[-1].startswith("--") and " " not in units[-1] and not word.startswith("-"):
            units[-1] += " " + word
        else:
            units.append(word)
    return units


def longest_piece(text: str) -> int:
    """The longest stretch of ``text`` that ``wrap`` does not break: a word, or a part of one
    between its separators."""
    return max((len(piece) for word in text.split() for piece in _SEPARATORS.split(word)), default=0)


def wrap(text: str, width: int = 120, *, indent: str = "") -> list[str]:
    """``text`` in lines of at most ``width`` characters, the lines after the first starting
    with ``indent``; broken between words (an option with its value), and inside a word only
    when it is longer than a line."""
    lines: list[str] = []
    line = ""
    for word in _units(text):
        for i, piece in enumerate(_pieces(word, max(1, width - len(indent)))):
            glue = " " if line and i == 0 else ""
            if line and len(line) + len(glue) + len(piece) > width:
                lines.append(line)
                line = indent + piece
            else:
                line += glue + piece
    return [*lines, line] if line else lines


def print_wrapped(text: str, width: int = 120) -> None:
    """Print ``text`` wrapped at the terminal's width (at most ``width``), the lines after the
    first indented: a terminal left to wrap a long line breaks it inside a word."""
    columns = min(width, shutil.get_terminal_size((width, 24)).columns)
    print("\n".join(wrap(text, columns, indent="  ")), flush=True)


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and its noun in agreement: "1 cell", "2 cells", "0 cells"."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def first_sentence(text: str | None) -> str:
    """The first sentence of an error's first line (up to ". " or the line's end), whole: what a
    table row shows of an exception, its full traceback staying in the record."""
    lines = (text or "").strip().splitlines()
    if not lines:
        return ""
    head = lines[0].strip()
    end = re.search(r"(?<=[^.\s][.!?])\s", head)
    return head[: end.start()] if end else head


#: the package's directory: ``python -m shardbench`` runs a ``__main__.py`` below it
_PACKAGE = Path(__file__).resolve().parent


def program() -> str:
    """The program as a command this tool suggests ("resume with: ...") names it: the way it
    was started, so that the suggestion runs as written. ``.venv/bin/shardbench`` when run so
    (a fresh clone's set-up puts nothing on PATH), plain ``shardbench`` where PATH finds that
    same script, ``python -m shardbench`` (the interpreter named likewise) for the module, and
    plain ``shardbench`` where no command line started it (the CLI called from Python)."""
    argv0 = sys.argv[0] if sys.argv else ""
    path = Path(argv0)
    if path.name == "__main__.py" and _PACKAGE in path.resolve().parents:
        return f"{_as_typed(sys.executable, 'python')} -m shardbench"
    if path.stem == "shardbench":
        return _as_typed(argv0, "shardbench")
    return "shardbench"


def _as_typed(path: str, name: str) -> str:
    """``name`` where PATH finds ``path`` by it; else ``path`` relative to the working directory
    when below it (``.venv/bin/shardbench``), else whole: a word the shell runs as written."""
    whole = os.path.abspath(path)
    if (found := shutil.which(name)) is not None and os.path.abspath(found) == whole:
        return name
    relative = os.path.relpath(whole)
    if relative.startswith(os.pardir):
        relative = whole
    elif os.sep not in relative:  # a bare name would be looked up on PATH, not here
        relative = os.path.join(os.curdir, relative)
    return shlex.quote(relative)
