"""The shard width S of a cell (hybrid sharding), fitted to its strategy and world size before
anything runs.

A strategy whose card takes ``shard_group`` shards within groups of S ranks and replicates
across the N/S groups; S must divide N. A suite or ``--shard-group`` gives S as a list crossed
with every other axis, so some of its cells do not take it: a strategy that shards over all
ranks (or not at all) runs once, flat, and an S that does not divide a world size is skipped
there, each said in one line. An S that fits no cell at all is a mistake, refused in one line.
A cell of a strategy that takes S but was given none gets S = N, so its record states it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from shardbench.harness.config import CellConfig
from shardbench.metrics.topology import divisors
from shardbench.strategies.registry import canonical_name, strategy_card, strategy_cards


def takes_shard_group(strategy: str) -> bool:
    """Whether ``strategy`` (a name or alias) shards in groups of a given width."""
    return strategy_card(strategy).shard_group


def fit_shard_groups(cells: Iterable[CellConfig]) -> tuple[list[CellConfig], list[str]]:
    """The cells where their shard width applies, in order (S fixed to N where a strategy that
    takes one was given none; a strategy that takes none once, flat), and one line for each
    kind of cell left out. ``ValueError`` in one line for an S that is no whole number >= 1, or
    that fits no cell."""
    cells = list(cells)
    kept: list[CellConfig] = []
    flat: dict[str, None] = {}
    undivided: dict[tuple[int, int], None] = {}
    fits: set[int] = set()
    for cell in cells:
        s = cell.shard_group
        if s is not None and (isinstance(s, bool) or not isinstance(s, int) or s < 1):
            raise ValueError(f"shard group must be a whole number of ranks >= 1, got {s!r}")
        name = canonical_name(cell.strategy)
        if not takes_shard_group(name):
            if s is not None:
                flat[name] = None
            cell = replace(cell, shard_group=None)
        elif s is None:
            cell = replace(cell, shard_group=cell.world_size)
        elif cell.world_size % s:
            undivided[(s, cell.world_size)] = None
            continue
        else:
            fits.add(s)
        if cell not in kept:
            kept.append(cell)
    asked = {c.shard_group for c in cells if c.shard_group is not None}
    if unfit := sorted(asked - fits):
        raise ValueError(_refusal(unfit[0], cells))
    lines = []
    if flat:
        names = ", ".join(flat)
        lines.append(
            f"shard group: {names} {'does' if len(flat) == 1 else 'do'} not shard in groups; "
            f"{'its' if len(flat) == 1 else 'their'} cells run once, over all ranks"
        )
    for s, n in undivided:
        lines.append(f"shard group {s} does not divide world size {n}: those cells skipped")
    return kept, lines


def _refusal(s: int, cells: list[CellConfig]) -> str:
    """Why ``s`` fits none of ``cells``, and what would."""
    takers = [c for c in cells if takes_shard_group(canonical_name(c.strategy))]
    if not takers:
        names = ", ".join(dict.fromkeys(canonical_name(c.strategy) for c in cells))
        allowed = ", ".join(c.name for c in strategy_cards() if c.shard_group)
        verb = "does" if "," not in names else "do"
        return f"shard group {s}: {names} {verb} not shard in groups; allowed: {allowed}"
    worlds = sorted({c.world_size for c in takers})
    allowed = sorted({d for n in worlds for d in divisors(n)})
    return (
        f"shard group {s} divides no world size of a strategy that shards in groups "
        f"({', '.join(map(str, worlds))}); allowed: {', '.join(map(str, allowed))}"
    )
