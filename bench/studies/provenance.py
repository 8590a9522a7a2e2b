"""What changed between a baseline and a run besides the code's numbers: the commits, the
versions of what the numbers depend on, and the machine.

A verdict of "improved" or "regressed" is a claim about a change; without naming it, a reader
cannot tell a commit's effect from a new torch, another host or noise. Every record carries its
environment (``records.capture_env``: ``git_sha``, versions, host, processor, cores), so the
facts are read from the two sides' records (``what_changed``, pure). How many commits lie
between the two shas only git can say, so ``with_commit_count`` asks it separately, from the
command line; a sha this checkout does not hold leaves the count unknown, never guessed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shardbench.records import CHECKOUT, PACKAGES, Record
from shardbench.studies.machines import rank_binding

#: software the numbers depend on, as (label, how a record's env holds it); the peers' and the
#: libraries' versions sit under ``env["packages"]``
VERSIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch", ("torch",)),
    ("shardbench", ("shardbench",)),
    ("python", ("python",)),
    ("cuda", ("cuda",)),
    *((name, ("packages", name)) for name in PACKAGES),
)
#: the facts that name the machine; a CPU's ``device_name`` is its ``cpu_model`` (not repeated)
MACHINE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("host", ("host",)),
    ("cpu", ("cpu_model",)),
    ("cores", ("cpu_count",)),
    ("gpu", ("gpu_name",)),
    ("gpus", ("device_count",)),
    ("rank binding", ("rank_binding",)),
)


@dataclass(frozen=True)
class Fact:
    """One fact on each side: its values (sorted; several where a side's runs disagree)."""

    name: str
    baseline: tuple[str, ...]
    current: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return self.baseline != self.current


@dataclass(frozen=True)
class CommitCount:
    """Commits in the run's history that the baseline's lacks (``ahead``), and the reverse."""

    baseline: str
    ahead: int
    behind: int


@dataclass(frozen=True)
class Provenance:
    """The two sides' commits and facts; a fact one side did not record is left out."""

    baseline_commits: tuple[str, ...]
    current_commits: tuple[str, ...]
    versions: tuple[Fact, ...]
    machine: tuple[Fact, ...]
    #: per baseline commit, as git counts it up to the run's (empty: not asked, or git cannot tell)
    counts: tuple[CommitCount, ...] = ()

    @property
    def same_commit(self) -> bool:
        return bool(self.current_commits) and self.baseline_commits == self.current_commits


def _value(env: dict[str, Any], path: tuple[str, ...]) -> str | None:
    for key in path:
        env = env.get(key) if isinstance(env, dict) else None  # type: ignore[assignment]
    return None if env is None else str(env)


def _env(r: Record) -> dict[str, Any]:
    """The record's env, with a GPU's name apart from the processor's, and how its ranks sat
    on the cores (``machines.rank_binding``)."""
    gpu = r.env.get("device_name") if r.device != "cpu" else None
    return {**r.env, "gpu_name": gpu, "rank_binding": rank_binding(r)}


def _facts(
    spec: Sequence[tuple[str, tuple[str, ...]]], base: Sequence[Record], cur: Sequence[Record]
) -> tuple[Fact, ...]:
    out = []
    for name, path in spec:
        b = sorted({v for r in base if (v := _value(_env(r), path)) is not None})
        c = sorted({v for r in cur if (v := _value(_env(r), path)) is not None})
        if b and c:
            out.append(Fact(name, tuple(b), tuple(c)))
    return tuple(out)


def _commits(records: Sequence[Record]) -> tuple[str, ...]:
    """The sides' commits, in the order their records first name them."""
    return tuple(dict.fromkeys(sha for r in records if (sha := r.env.get("git_sha"))))


def what_changed(baseline: Sequence[Record], current: Sequence[Record]) -> Provenance:
    """The commits, versions and machine facts of both sides, read from their records."""
    return Provenance(
        baseline_commits=_commits(baseline),
        current_commits=_commits(current),
        versions=_facts(VERSIONS, baseline, current),
        machine=_facts(MACHINE, baseline, current),
    )


def git_count(base: str, head: str, root: Path = CHECKOUT) -> tuple[int, int] | None:
    """(commits in ``head`` not in ``base``, commits in ``base`` not in ``head``), as this
    checkout's git counts them; None where git is absent or either commit is not in its history."""
    try:
        r = subprocess.run(
            ["git", "rev-list", "--left-right", "--count", f"{base}...{head}"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    parts = r.stdout.split()
    if r.returncode != 0 or len(parts) != 2:
        return None
    behind, ahead = (int(p) for p in parts)
    return ahead, behind


def with_commit_count(
    p: Provenance, count: Callable[[str, str], tuple[int, int] | None] = git_count
) -> Provenance:
    """``p`` with each baseline commit's distance to the run's commit, where the run has one
    commit and ``count`` can tell."""
    if len(p.current_commits) != 1:
        return p
    head = p.current_commits[0]
    counts = []
    for base in p.baseline_commits:
        if (found := count(base, head)) is not None:
            counts.append(CommitCount(base, *found))
    return replace(p, counts=tuple(counts))
