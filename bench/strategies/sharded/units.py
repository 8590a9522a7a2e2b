"""Which parameters stage 3 gathers together: the unit policy and the unit tree.

A *unit* is a module whose parameters are gathered as one flat buffer just before it runs and
freed right after, as FSDP's wrapping policy decides. The root module is always a unit, for the
parameters no other unit claims; it stays gathered from the start of forward to the end of its
backward (as FSDP keeps its root), since backward begins with it.

The one idea: every parameter is gathered by exactly one unit, the lowest common ancestor (in
the unit tree) of every unit whose modules use it. A weight tied between two units (an input
embedding and the output head) therefore lives in a unit that encloses both, which is gathered
whenever either runs: gathered once, its gradient reduced once. Units may nest (a unit inside
another is gathered inside its parent's forward, when the parent is already gathered).

The rule is the same for a frozen parameter (``requires_grad=False``): it is sharded and
gathered with its unit like a trainable one, and only its bookkeeping differs (no gradient, no
optimizer state), so a unit lists the two apart: ``params`` (the optimizer's) and ``frozen``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from torch import nn

from shardbench.blocks import repeated_blocks
from shardbench.wording import count

UnitPolicy = Callable[[nn.Module], bool]


@dataclass
class Unit:
    """A module gathered as a whole; ``params`` are the trainable parameters it gathers,
    ``frozen`` those it gathers that take no gradient."""

    index: int
    name: str  # "" for the root
    module: nn.Module
    parent: int | None  # index of the enclosing unit; None for the root
    params: list[nn.Parameter] = field(default_factory=list)
    frozen: list[nn.Parameter] = field(default_factory=list)

    @property
    def is_root(self) -> bool:
        return self.parent is None


def default_unit_policy(root: nn.Module) -> UnitPolicy:
    """The units of ``repeated_blocks(root)`` (the root takes what remains)."""
    chosen = {id(m) for m in repeated_blocks(root)}
    return lambda module: id(module) in chosen


def find_units(
    root: nn.Module,
    policy: UnitPolicy | None,
    sharded: list[nn.Parameter],
    frozen: Sequence[nn.Parameter] = (),
) -> list[Unit]:
    """The units of ``root`` under ``policy`` (None: ``default_unit_policy``), root first; each
    holds the parameters of ``sharded`` (in ``params``) and of ``frozen`` (in ``frozen``) it
    gathers (see the module docstring). Units left without parameters (all tied into an
    enclosing unit) are dropped: there is nothing to gather for them."""
    is_unit = policy if policy is not None else default_unit_policy(root)
    units = [Unit(0, "", root, None)]
    unit_of_module: dict[int, int] = {id(root): 0}
    users: dict[int, set[int]] = {}  # id(param) -> units whose modules register it
    frozen_ids = {id(p) for p in frozen}
    wanted = {id(p) for p in sharded} | frozen_ids

    def visit(module: nn.Module, prefix: str, unit: int) -> None:
        for p in module._parameters.values():
            if p is not None and id(p) in wanted:
                users.setdefault(id(p), set()).add(unit)
        for name, child in module._modules.items():
            if child is None:
                continue
            path = f"{prefix}.{name}" if prefix else name
            inner = unit
            if id(child) in unit_of_module:
                inner = unit_of_module[id(child)]
            elif child is not root and is_unit(child):
                inner = len(units)
                units.append(Unit(inner, path, child, unit))
                unit_of_module[id(child)] = inner
            visit(child, path, inner)

    visit(root, "", 0)
    missing = [p for p in (*sharded, *frozen) if id(p) not in users]
    if missing:
        raise ValueError(
            f"{count(len(missing), 'parameter')} to shard (first of shape {tuple(missing[0].shape)}) "
            f"{'is' if len(missing) == 1 else 'are'} not registered in the wrapped module: stage 3 gathers "
            "only the module's own parameters"
        )

    for p in (*sharded, *frozen):
        owner = _lowest_common_unit(units, users[id(p)])
        (units[owner].frozen if id(p) in frozen_ids else units[owner].params).append(p)
    return _kept(units)


def _lowest_common_unit(units: list[Unit], users: set[int]) -> int:
    """The innermost unit enclosing every unit in ``users``: a parameter tied into several units
    is gathered by the one that holds them all."""

    def ancestors(u: int) -> list[int]:
        chain = [u]
        while (parent := units[chain[-1]].parent) is not None:
            chain.append(parent)
        return chain

    chains = [ancestors(u) for u in sorted(users)]
    common = set(chains[0]).intersection(*chains[1:])
    return next(u for u in chains[0] if u in common)


def _kept(units: list[Unit]) -> list[Unit]:
    """The units with parameters to gather (and the root), renumbered in order, each parent the
    nearest kept unit above it."""
    kept = [u for u in units if u.params or u.frozen or u.is_root]
    renumber = {u.index: i for i, u in enumerate(kept)}
    for u in kept:
        parent = u.parent
        while parent is not None and parent not in renumber:
            parent = units[parent].parent
        u.index, u.parent = renumber[u.index], None if parent is None else renumber[parent]
    return kept
