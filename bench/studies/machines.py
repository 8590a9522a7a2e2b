"""Which machine a record was measured on, and picking a baseline's records of this machine.

Numbers measured on different software or hardware do not compare: a step-time ratio to ddp
depends on the processor (the share of communication in a step), and every figure on torch.
So a record's *machine* is its environment facts of ``MACHINE_KEYS``, and ``compare`` refuses two
sides whose ``ENV_KEYS`` differ (``env_changes``): those facts and how the ranks sat on the cores.

A baseline may hold records of several machines (``baseline save --add``): a CI fleet whose
runners come in two processor models keeps one baseline name, with a set of records for each.
``for_machine`` then picks the set measured on the machine of the other side, so a night is
always judged against its own kind of machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from shardbench.records import measured_as


class Measured(Protocol):
    """What is read of a record here (a ``Record``, or the shape of one for this machine)."""

    device: str
    schema: int
    env: dict[str, Any]


#: environment facts that make two runs' numbers incomparable when they differ. The device's
#: name is checked here rather than matched as part of a cell: under ``--allow-env-change`` the
#: same cell on another card is still the same cell, compared and marked. Between CPU records
#: the processor is checked as ``cpu_model``; their ``device_name`` names the same processor (or,
#: in records written before it did, only the architecture), so it is not compared twice.
#: ``rank_binding`` is how a CPU cell's ranks sat on the cores (``core_binding``): bound ranks
#: and ranks free to move collide differently, so their step-time ratios do not compare. It is
#: how a machine was used, not which machine: ``MACHINE_KEYS`` leave it out, so a baseline's
#: records of a processor are found (and replaced by ``baseline save --add``) whichever it was.
ENV_KEYS = ("torch", "device_name", "cpu_model", "schema", "rank_binding")
MACHINE_KEYS = tuple(key for key in ENV_KEYS if key != "rank_binding")


def env_value(record: Measured, key: str) -> Any:
    """``record``'s fact ``key`` as the environment check reads it (None: not compared)."""
    if key == "schema":  # what was measured, not how it is written (``records.MEASURED_ALIKE``)
        return measured_as(record.schema)
    if key == "cpu_model" and record.device != "cpu":
        return None  # a GPU record's processor does not decide its numbers
    if key == "device_name" and record.device == "cpu":
        return None  # the processor: cpu_model
    if key == "rank_binding":
        return rank_binding(record)
    return record.env.get(key)


def rank_binding(record: Measured) -> str | None:
    """How a CPU record's ranks sat on the cores: its ``env["rank_binding"]`` ("bound" or
    "free": the launcher's, on every record of a run, a failed cell's included); for a record
    without it, its ``placement``'s (``bound_cores_each``, else "free": ranks never bound), and
    None where it has none either (unknown: not compared). None on a GPU."""
    if record.device != "cpu":
        return None
    if (said := record.env.get("rank_binding")) is not None:
        return said
    placed = getattr(record, "placement", None)
    if not isinstance(placed, dict):
        return None
    return "bound" if placed.get("bound_cores_each") else "free"


def env_changes(baseline: Sequence[Measured], current: Sequence[Measured]) -> dict[str, tuple[list, list]]:
    """{key: (baseline values, current values)} for each ``ENV_KEYS`` fact that differs. A fact
    neither side's records hold (older records, written before it existed) is not compared."""

    def values(records: Sequence[Measured], key: str) -> list[Any] | None:
        got = {env_value(r, key) for r in records} - {None}
        return sorted(got, key=str) or None

    out = {}
    for key in ENV_KEYS:
        b, c = values(baseline, key), values(current, key)
        if b is not None and c is not None and b != c:
            out[key] = (b, c)
    return out


def machine_of(record: Measured) -> tuple[Any, ...]:
    """The machine ``record`` was measured on: its ``MACHINE_KEYS`` facts."""
    return tuple(env_value(record, key) for key in MACHINE_KEYS)


def machines(records: Sequence[Measured]) -> list[tuple[Any, ...]]:
    """The machines of ``records``, in the order they first appear."""
    return list(dict.fromkeys(machine_of(r) for r in records))


def describe(machine: tuple[Any, ...]) -> str:
    """A machine in words: ``torch 2.11.0, cpu_model AMD EPYC, schema 3``."""
    return ", ".join(f"{k} {v}" for k, v in zip(MACHINE_KEYS, machine, strict=True) if v is not None)


def for_machine(baseline: Sequence[Measured], current: Sequence[Measured]) -> list[Any]:
    """The records of ``baseline`` to judge ``current`` against: where the baseline holds several
    machines, those of ``current``'s machine, or, if none is it, those of the machine added last
    (``--add`` appends; the environment check then names what differs from that one); one
    machine's baseline whole."""
    held = machines(baseline)
    if len(held) < 2:
        return list(baseline)
    here = set(machines(current)) & set(held) or {held[-1]}
    return [r for r in baseline if machine_of(r) in here]
