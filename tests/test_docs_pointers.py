"""A pointer to a section by its name (``docs/measuring.md, "Speed verdicts"``), in the README,
the docs, the code's messages and the examples, names a heading the page has, word for word:
a reader searching the page for it finds it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: a page, then (after a comma, "section" or nothing) a quoted section name
POINTER = re.compile(r"((?:docs/)?[a-z0-9_-]+\.md)(?:,| section| \()?\s+[\"“]([^\"”\n]{3,80})[\"”]")


def headings(page: Path) -> set[str]:
    return {line.lstrip("#").strip() for line in page.read_text().splitlines() if re.match(r"#{1,6} ", line)}


def sources() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    kept = [
        ROOT / name
        for name in listed.stdout.split()
        if name == "README.md"
        or (name.startswith("docs/") and name.endswith(".md"))
        or (name.startswith(("bench/", "examples/", "models/")) and name.endswith(".py"))
    ]
    return [p for p in kept if p.exists()]


def dangling(text: str, where: str) -> list[str]:
    """Each pointer of ``text`` to a section its page does not have."""
    found = []
    for m in POINTER.finditer(" ".join(text.split())):
        name, section = m.groups()
        page = ROOT / name if (ROOT / name).exists() else ROOT / "docs" / name
        if page.suffix == ".md" and page.exists() and section not in headings(page):
            found.append(f"{where}: {name}, {section!r}")
    return found


def test_every_named_section_is_a_heading_of_its_page() -> None:
    broken = [line for path in sources() for line in dangling(path.read_text(), str(path.relative_to(ROOT)))]
    assert broken == []


def test_a_missing_section_is_caught() -> None:
    assert dangling('see docs/measuring.md, "Speed verdicts"', "x") == []
    assert dangling('see docs/measuring.md, "Speed verdict"', "x") == [
        "x: docs/measuring.md, 'Speed verdict'"
    ]
