"""What changed between the baseline and the run, in the one or two lines a verdict opens with:
the commit range (and how many commits, where git could count them), the versions and machine
facts that differ, and those that did not. A reader then knows what an "improved" is an
improvement of, or that on the same commit a change can only be the environment or noise."""

from __future__ import annotations

from shardbench.studies.provenance import CommitCount, Fact, Provenance
from shardbench.wording import count

#: a commit as a reader finds it in ``git log --oneline``
SHORT = 7
#: how each machine fact reads when it is the same on both sides: ``2 cores``, not ``cores 2``
_AFTER = ("cores", "gpus")


def _short(shas: tuple[str, ...]) -> str:
    return ",".join(s[:SHORT] for s in shas)


def _count(c: CommitCount, several: bool) -> str:
    since = f" since {c.baseline[:SHORT]}" if several else ""
    if c.behind:
        return f"{c.ahead} ahead{since}, {c.behind} behind: not a descendant"
    return f"{count(c.ahead, 'commit')}{since}"


def commit_text(p: Provenance) -> str:
    """``commits 7f79500..607f81f (27 commits)``, or why the range cannot be said."""
    base, cur = p.baseline_commits, p.current_commits
    if not base and not cur:
        return "commits unknown (neither side ran from a git checkout)"
    if p.same_commit:
        return f"the same commit {_short(cur)} on both sides: any change is the environment's or noise"
    text = f"commits {_short(base) or 'unknown'}..{_short(cur) or 'unknown'}"
    if not base or not cur:
        return text
    if p.counts:
        several = len(p.counts) > 1
        return f"{text} ({', '.join(_count(c, several) for c in p.counts)})"
    return f"{text} (how many between: not in this checkout's git history)"


def _values(values: tuple[str, ...]) -> str:
    return "/".join(values)


def _changed(fact: Fact) -> str:
    return f"{fact.name} {_values(fact.baseline)} -> {_values(fact.current)}"


def _same(fact: Fact) -> str:
    value = _values(fact.current)
    return f"{value} {fact.name}" if fact.name in _AFTER else f"{fact.name} {value}"


def provenance_lines(p: Provenance | None) -> list[str]:
    """``since the baseline: ...; changed: ...`` and, where anything held, ``same on both sides:
    ...``; no lines where nothing was read."""
    if p is None:
        return []
    versions = [_changed(f) for f in p.versions if f.changed]
    machine = [_changed(f) for f in p.machine if f.changed]
    changed = "; ".join(
        part
        for part in (
            f"versions changed: {', '.join(versions)}" if versions else "",
            f"machine changed: {', '.join(machine)}" if machine else "",
        )
        if part
    )
    first = f"since the baseline: {commit_text(p)}; " + (changed or "no version or machine change")
    # a peer absent on both sides says nothing about the numbers
    held = [_same(f) for f in p.versions if not f.changed and f.current != ("not installed",)]
    held_machine = [_same(f) for f in p.machine if not f.changed]
    same = "; ".join(part for part in (", ".join(held), ", ".join(held_machine)) if part)
    return [first, *([f"same on both sides: {same}"] if same else [])]
