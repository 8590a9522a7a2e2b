"""Strategies by name (and alias). An unknown name raises ``ValueError`` listing the valid ones."""

from __future__ import annotations

from bench.strategies.base import Strategy
from bench.strategies.ddp import DDPStrategy
from bench.strategies.dp import DPStrategy

_STRATEGIES: dict[str, type[Strategy]] = {cls.name: cls for cls in (DPStrategy, DDPStrategy)}
_ALIASES: dict[str, str] = {a: cls.name for cls in _STRATEGIES.values() for a in cls.aliases}


def strategy_names() -> list[str]:
    return list(_STRATEGIES)


def canonical_name(name: str) -> str:
    if name in _STRATEGIES:
        return name
    if name in _ALIASES:
        return _ALIASES[name]
    allowed = ", ".join([*_STRATEGIES, *(f"{a} (= {c})" for a, c in _ALIASES.items())])
    raise ValueError(f"unknown strategy {name!r}; allowed: {allowed}")


def get_strategy(name: str) -> Strategy:
    return _STRATEGIES[canonical_name(name)]()


def strategy_classes() -> list[type[Strategy]]:
    return list(_STRATEGIES.values())
