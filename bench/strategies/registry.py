"""Strategies by name (and alias). An unknown name raises ``ValueError`` listing the valid ones.

Reports read each strategy's declared ``display`` from here (``display_of``), so a name no
strategy has (an old record) is the report's to render with a fallback, not an error."""

from __future__ import annotations

from bench.strategies.base import Display, Strategy
from bench.strategies.ddp import DDPStrategy
from bench.strategies.dp import DPStrategy
from bench.strategies.fsdp2 import FSDP2Zero2Strategy, FSDP2Zero3Strategy
from bench.strategies.torch_zero1 import TorchZero1Strategy
from bench.strategies.zero1 import Zero1Strategy
from bench.strategies.zero2 import Zero2Strategy

_STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (
        DPStrategy,
        DDPStrategy,
        Zero1Strategy,
        Zero2Strategy,
        TorchZero1Strategy,
        FSDP2Zero2Strategy,
        FSDP2Zero3Strategy,
    )
}
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


def display_of(name: str) -> Display | None:
    """How reports show ``name`` (an alias shows as its strategy); None for an unknown name."""
    cls = _STRATEGIES.get(_ALIASES.get(name, name))
    return cls.display if cls is not None else None


def reference_strategy() -> str:
    """The baseline every memory saving is measured against (the one declaring ``reference``)."""
    (name,) = [c.name for c in _STRATEGIES.values() if c.display.reference]
    return name
