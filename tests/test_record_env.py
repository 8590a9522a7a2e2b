"""A record's ``env``: the checkout's commit, read from the repository's files, is the one git
names, in each layout those files take; and the package versions a record names."""

from __future__ import annotations

import subprocess
from pathlib import Path

from shardbench.records import PACKAGES, _git_sha, package_versions


def _git(cwd: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main", *args]
    return subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_the_commit_is_gits_in_every_layout_of_the_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    assert _git_sha(repo) is None  # no commit yet
    (repo / "a").write_text("1")
    _git(repo, "add", "a")
    _git(repo, "commit", "-qm", "one")
    assert _git_sha(repo) == _git(repo, "rev-parse", "HEAD")  # a loose ref
    (repo / "a").write_text("2")
    _git(repo, "commit", "-qam", "two")
    _git(repo, "pack-refs", "--all")
    assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    assert _git_sha(repo) == _git(repo, "rev-parse", "HEAD")  # a packed ref
    first = _git(repo, "rev-parse", "HEAD~1")
    _git(repo, "checkout", "-q", first)
    assert _git_sha(repo) == first  # a detached HEAD
    _git(repo, "worktree", "add", "-q", str(tmp_path / "tree"), "main")
    assert (tmp_path / "tree" / ".git").is_file()
    assert _git_sha(tmp_path / "tree") == _git(repo, "rev-parse", "main")  # a worktree: git asked
    assert _git_sha(tmp_path) is None  # not a checkout


def test_every_package_a_record_names_has_a_version_or_says_it_is_absent() -> None:
    versions = package_versions()
    assert list(versions) == list(PACKAGES)
    assert all(v == "not installed" or v[0].isdigit() for v in versions.values()), versions
    assert package_versions(("no-such-package-here",)) == {"no-such-package-here": "not installed"}
