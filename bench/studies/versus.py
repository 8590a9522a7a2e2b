"""Each strategy against ddp in the same group of cells: the ratios a reader acts on.

A group is the cells equal in all but the strategy (the same workload, preset, world size,
precision, batch, activation checkpointing and simulated/fake mode: ``CellKey`` less the
strategy). In each group with an ok ddp cell, every other ok strategy's peak, model states, step
time and bytes sent per step are set against ddp's; the step time with the run's speed verdict
(``speed_verdict``: faster or slower only beyond what a rerun of the same code would show). The
terminal's ratio lines and the HTML report's summary table both render these, so they never
disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardbench.records import CellKey, Record
from shardbench.studies.reference import REFERENCE, step_time_ratio
from shardbench.studies.speed_verdict import SpeedVerdict, speed_verdicts, unpaired


def model_states(r: Record) -> int | None:
    """Model states of a cell: those held after a step where the record has them
    (``model_state_bytes``), else the params + grads + optimizer of the peak breakdown."""
    held = r.model_state_bytes
    if held:
        return held.get("total", sum(held.get(k, 0) for k in ("params", "grads", "optimizer")))
    bd = r.mem_breakdown_bytes or {}
    return sum(bd.get(k, 0) for k in ("params", "grads", "optimizer")) if bd else None


def peak(r: Record) -> int | None:
    return (r.peak_mem_bytes or {}).get("max")


def sent(r: Record) -> int | None:
    return (r.comm_per_step or {}).get("sent_per_rank")


def _ratio(ours: float | None, base: float | None) -> float | None:
    return ours / base if ours is not None and base else None


@dataclass(frozen=True)
class Versus:
    """One strategy's cell against its group's ddp cell: ratios (None where either side has
    no value) and the cell's speed verdict over all its repeats (``speed_verdict``; None
    without times)."""

    record: Record
    base: Record
    peak: float | None
    model_states: float | None
    step_time: float | None
    speed: SpeedVerdict | None
    sent: float | None


@dataclass(frozen=True)
class Group:
    """A group of comparable cells: its key (``strategy`` blank), ddp's cell and the others';
    ``repeat`` says which repeat of the cells it is where they were repeated (None where not)."""

    key: CellKey
    base: Record
    others: tuple[Versus, ...]
    repeat: int | None = None


def group_key(r: Record) -> CellKey:
    """The cells whose strategies are set against each other: equal in all but the strategy."""
    return CellKey.of(r)._replace(strategy="", shard_group=None)


def repeated(records: Sequence[Record]) -> bool:
    """Whether the cells were repeated (``run --repeat``): each row must then say which repeat."""
    return any(r.repeat for r in records)


def against_reference(records: Sequence[Record]) -> list[Group]:
    """Per group with an ok ddp cell and another ok strategy, in the records' order: each other
    strategy against ddp. Max-size summaries (a search's answer, not a cell) are left out.
    Repeated cells are paired repeat by repeat (each strategy's repeat i against ddp's repeat i,
    measured in the same round), a group per repeat, as ``compare`` pairs them; each carries
    the verdict of its cell over all its repeats."""
    by_repeat = repeated(records)
    verdicts = speed_verdicts(records)
    groups: dict[tuple[CellKey, int | None], list[Record]] = {}
    for r in records:
        if r.status == "ok" and not r.max_size:
            groups.setdefault((group_key(r), r.repeat if by_repeat else None), []).append(r)
    out = []
    for (key, repeat), members in groups.items():
        base = next((r for r in members if r.strategy == REFERENCE), None)
        if base is None or len(members) < 2:
            continue
        others = tuple(
            Versus(
                record=r,
                base=base,
                peak=_ratio(peak(r), peak(base)),
                model_states=_ratio(model_states(r), model_states(base)),
                step_time=step_time_ratio(r, base),
                # the cell's verdict pairs it with its own run's ddp: set against another
                # run's, the ratio is across runs and is not judged
                speed=(verdicts.get(CellKey.of(r)) if r.run_id == base.run_id else None) or unpaired(r, base),
                sent=_ratio(sent(r), sent(base)),
            )
            for r in members
            if r.strategy != REFERENCE
        )
        if others:
            out.append(Group(key, base, others, repeat))
    return out
