"""``results/README.md`` indexes every folder of evidence, and no link in it, in the README, in
``docs/`` or in a results folder's own pages leads nowhere.

The repository's files are what git would commit (tracked, or untracked and not ignored), so a
link to a git-ignored page (an ``index.html`` that ``shardbench report`` rebuilds) fails here, as
it would on a fresh clone. An index entry is a heading that links into its folder. The index's
level: a folder of ``results/`` holding only folders (``cpu/``, ``gpu/``, ``claim/``) is indexed
by its children; any other by itself.
"""

from __future__ import annotations

import posixpath
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INDEX = "results/README.md"

LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"`[^`]*`")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:


def repo_files() -> set[str]:
    """What a clone would hold: tracked files, and untracked ones git does not ignore."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: which files are committed is unknown")
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return {p for p in out.split("\0") if p and (ROOT / p).exists()}


def folders_of(files: set[str]) -> set[str]:
    """Every folder that holds a file, at any depth ("a/b" for "a/b/c/d.txt" too)."""
    out = set()
    for f in files:
        parts = f.split("/")[:-1]
        out.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    return out


def evidence_folders(files: set[str]) -> set[str]:
    """The folders of ``results/`` at the index's level, relative to ``results/``."""
    under = [f.split("/")[1:] for f in files if f.startswith("results/")]
    holds_files = {p[0] for p in under if len(p) == 2}
    return {p[0] if p[0] in holds_files else f"{p[0]}/{p[1]}" for p in under if len(p) > 1}


def markdown_lines(text: str) -> Iterator[tuple[int, str]]:
    """Numbered lines outside fenced and indented code blocks."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced and not line.startswith(("    ", "\t")):
            yield n, line


def links(text: str) -> Iterator[tuple[int, str]]:
    """Each link's target, by line; a code span is text, even where it reads like a link."""
    for n, line in markdown_lines(text):
        for m in LINK.finditer(CODE_SPAN.sub("x", line)):
            yield n, m.group(1)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text in lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.lstrip("#")).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {slug(line) for _, line in markdown_lines(text) if line.startswith("#")}


def broken_links(page: str, text: str, files: set[str], read: Callable[[str], str]) -> list[str]:
    """Each relative link of ``page`` (a repository path) to a file, folder or heading not there.
    ``read``: a repository page's text, for the headings of the pages linked to."""
    known = files | folders_of(files)
    broken = []
    for n, target in links(text):
        if EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(page), path)) if path else page
        if resolved == ".." or resolved.startswith(("../", "/")) or resolved not in known:
            broken.append(f"{page}:{n}: {target} (no {resolved} in the repository)")
        elif anchor and resolved.endswith(".md"):
            if anchor not in anchors(text if resolved == page else read(resolved)):
                broken.append(f"{page}:{n}: {target} (no heading #{anchor} in {resolved})")
    return broken


def read_page(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


def indexed(index_text: str) -> set[str]:
    """Where the index's entries lead: each heading's links, relative to ``results/``."""
    lines = index_text.splitlines()
    headings = [(n, t) for n, t in links(index_text) if lines[n - 1].startswith("#")]
    return {posixpath.normpath(target.partition("#")[0]) for _, target in headings}


def unindexed(folders: set[str], entries: set[str]) -> list[str]:
    return sorted(f for f in folders if not any(e == f or e.startswith(f + "/") for e in entries))


def pages(files: set[str]) -> list[str]:
    """The pages whose links must hold: the README, the docs, and every page under results/."""
    return sorted(
        f for f in files if f.endswith(".md") and (f == "README.md" or f.startswith(("docs/", "results/")))
    )


def test_every_results_folder_has_an_entry_in_the_index() -> None:
    files = repo_files()
    assert INDEX in files
    folders = evidence_folders(files)
    assert {"claim/cpu", "samples", "baselines/cpu"} <= folders  # the level the index uses
    missing = unindexed(folders, indexed(read_page(INDEX)))
    assert not missing, f"results/ folders with no entry (a heading linking to it) in {INDEX}: {missing}"


def test_every_relative_link_in_the_readme_docs_and_results_resolves() -> None:
    files = repo_files()
    checked = pages(files)
    assert {"README.md", INDEX, "docs/strategies.md"} <= set(checked)
    broken = [b for page in checked for b in broken_links(page, read_page(page), files, read_page)]
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)


def test_a_new_folder_without_an_entry_is_reported() -> None:
    files = {"results/README.md", "results/cpu/a/records.jsonl", "results/cpu/b/README.md", "results/x/y.md"}
    folders = evidence_folders(files)
    assert folders == {"cpu/a", "cpu/b", "x"}
    assert unindexed(folders, indexed("### [cpu/a/](cpu/a/)\n### [x](x/y.md)\nsee [cpu/b](cpu/b/)\n")) == [
        "cpu/b"  # linked from a sentence, not from an entry's heading
    ]


def test_a_link_to_a_missing_or_ignored_file_or_heading_is_reported() -> None:
    files = {"docs/a.md", "results/cpu/r/table.md", "README.md"}
    text = (
        "# A heading\n"
        "[ok](../results/cpu/r/) [ok](../results/cpu/r/table.md) [web](https://example.org/x)\n"
        "[gone](../results/cpu/r/index.html) [outside](../../etc/passwd)\n"
        "    [in code](nowhere.md)\n`[span](nowhere.md)` [`code`](../README.md)\n"
        "[self](#a-heading) [no](#b-heading) [other](../README.md#shardbench) [no](../README.md#none)\n"
    )
    readme = {"README.md": "# shardbench\n\n## The `plan` (fake)\n"}
    assert [b.split(" (")[0] for b in broken_links("docs/a.md", text, files, readme.__getitem__)] == [
        "docs/a.md:3: ../results/cpu/r/index.html",
        "docs/a.md:3: ../../etc/passwd",
        "docs/a.md:6: #b-heading",
        "docs/a.md:6: ../README.md#none",
    ]
    assert anchors(readme["README.md"]) == {"shardbench", "the-plan-fake"}


#: what the CLI, the models and the examples print or say to read: a docs page (and heading), or
#: a README heading by name
POINTER = re.compile(r"(docs/[a-z0-9_-]+\.md)(#[a-z0-9-]+)?|README: \"?([A-Z][^\")\n]*)")


def test_every_pointer_the_code_and_examples_print_resolves() -> None:
    files = repo_files()
    sources = sorted(
        f for f in files if f.endswith(".py") and f.split("/")[0] in ("bench", "models", "examples")
    )
    broken = []
    for source in sources:
        for m in POINTER.finditer(read_page(source)):
            page, anchor, heading = m.groups()
            if heading is not None:
                if slug(heading) not in anchors(read_page("README.md")):
                    broken.append(f"{source}: README heading {heading!r}")
            elif page not in files:
                broken.append(f"{source}: {page}")
            elif anchor and anchor[1:] not in anchors(read_page(page)):
                broken.append(f"{source}: {page}{anchor}")
    assert not broken, broken
