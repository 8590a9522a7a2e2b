"""A verdict names what changed between the baseline and the run: the commit range and how many
commits lie in it, the versions and the machine facts that differ, and those that held; the
printed verdict, compare.md and compare.json all carry it."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from shardbench.cli import main
from shardbench.records import CHECKOUT, Record, append_record
from shardbench.report.compare_report import to_json, to_markdown, to_text
from shardbench.report.provenance_text import provenance_lines
from shardbench.studies.compare import compare_runs
from shardbench.studies.provenance import git_count, what_changed, with_commit_count
from tests.records import make_record

OLD, NEW = "a" * 40, "b" * 40
ENV = {
    "torch": "2.11.0",
    "python": "3.11.7",
    "device_name": "x86_64",
    "host": "vm",
    "cpu_count": 2,
    "packages": {"deepspeed": "0.19.8", "fairscale": "not installed"},
}


def _rec(strategy: str = "ddp", **env) -> Record:
    return make_record(strategy=strategy, peak_mem_bytes={"max": 1 << 30}, env={**ENV, **env})


def test_the_commits_versions_and_machine_that_differ_are_named() -> None:
    base = [_rec(git_sha=OLD), _rec("zero2", git_sha=OLD)]
    now = [_rec(git_sha=NEW, host="ci-2", cpu_count=4, packages={**ENV["packages"], "deepspeed": "0.20.0"})]
    counted = with_commit_count(
        what_changed(base, now), lambda b, h: (27, 0) if (b, h) == (OLD, NEW) else None
    )
    first, same = provenance_lines(counted)
    assert first == (
        "since the baseline: commits aaaaaaa..bbbbbbb (27 commits); versions changed: deepspeed "
        "0.19.8 -> 0.20.0; machine changed: host vm -> ci-2, cores 2 -> 4"
    )
    assert same == "same on both sides: torch 2.11.0, python 3.11.7"  # a peer absent on both is not said


def test_ranks_bound_to_cores_since_the_baseline_are_named() -> None:
    free = [
        replace(_rec(strategy, git_sha=OLD), placement={"ranks": 2, "cores": 2})
        for strategy in ("ddp", "zero2")
    ]
    bound = [replace(free[0], placement={"ranks": 2, "cores": 2, "bound_cores_each": 1})]
    first, _ = provenance_lines(what_changed(free, bound))
    assert first.endswith("machine changed: rank binding free -> bound")


def test_one_commit_on_both_sides_says_a_change_is_not_the_codes() -> None:
    (first, _) = provenance_lines(what_changed([_rec(git_sha=NEW)], [_rec(git_sha=NEW)]))
    assert first == (
        "since the baseline: the same commit bbbbbbb on both sides: any change is the environment's "
        "or noise; no version or machine change"
    )


def test_a_range_git_cannot_count_or_a_side_without_a_commit_is_said() -> None:
    unknown = with_commit_count(what_changed([_rec(git_sha=OLD)], [_rec(git_sha=NEW)]), lambda b, h: None)
    assert (
        "commits aaaaaaa..bbbbbbb (how many between: not in this checkout's git history)"
        in (provenance_lines(unknown)[0])
    )
    aside = with_commit_count(what_changed([_rec(git_sha=OLD)], [_rec(git_sha=NEW)]), lambda b, h: (5, 2))
    assert "(5 ahead, 2 behind: not a descendant)" in provenance_lines(aside)[0]
    assert "commits unknown..bbbbbbb;" in provenance_lines(what_changed([_rec()], [_rec(git_sha=NEW)]))[0]


def test_several_baseline_commits_are_each_counted() -> None:
    base = [_rec(git_sha=OLD), _rec("zero2", git_sha="c" * 40)]
    p = with_commit_count(what_changed(base, [_rec(git_sha=NEW)]), lambda b, h: (3 if b == OLD else 1, 0))
    assert (
        "commits aaaaaaa,ccccccc..bbbbbbb (3 commits since aaaaaaa, 1 commit since ccccccc)"
        in (provenance_lines(p)[0])
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_counts_the_commits_of_this_checkout() -> None:
    def sha(rev: str) -> str:
        return subprocess.run(
            ["git", "rev-parse", rev], cwd=CHECKOUT, capture_output=True, text=True
        ).stdout.strip()

    head, back = sha("HEAD"), sha("HEAD~3")
    if not head or not back:
        pytest.skip("not a git checkout with three commits")
    # every commit HEAD~3 lacks, merged branches' included: three or more
    between = int(
        subprocess.run(
            ["git", "rev-list", "--count", f"{back}..{head}"], cwd=CHECKOUT, capture_output=True, text=True
        ).stdout
    )
    assert between >= 3
    assert git_count(back, head) == (between, 0) and git_count(head, back) == (0, between)
    assert git_count("0" * 40, head) is None


def test_every_output_of_a_comparison_carries_it(tmp_path: Path, capsys) -> None:
    base, now = [_rec(git_sha=OLD)], [_rec(git_sha=NEW, torch="2.12.0")]
    c = compare_runs(base, now, allow_env_change=True)
    text = to_text(c).splitlines()
    assert (
        text[1].startswith("since the baseline: commits aaaaaaa..bbbbbbb")
        and "torch 2.11.0 -> 2.12.0" in text[1]
    )
    assert "- since the baseline: commits aaaaaaa..bbbbbbb" in to_markdown(c, baseline="b", current="c")
    data = to_json(c, baseline="b", current="c")["provenance"]
    assert list(data["baseline_commits"]) == [OLD] and data["lines"] == provenance_lines(c.provenance)
    for side, records in (("base", base), ("cur", now)):
        for r in records:
            append_record(tmp_path / side / "records.jsonl", r)
    assert main(["compare", str(tmp_path / "base"), str(tmp_path / "cur"), "--allow-env-change"]) == 0
    assert "since the baseline: commits aaaaaaa..bbbbbbb (how many between" in capsys.readouterr().out
    saved = json.loads((tmp_path / "cur" / "compare.json").read_text())["provenance"]
    assert saved["versions"][0] == {"name": "torch", "baseline": ["2.11.0"], "current": ["2.12.0"]}
