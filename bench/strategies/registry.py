"""Strategies by name (and alias). An unknown name raises ``ValueError`` listing the valid ones.

Names, aliases and declarations come from ``shardbench.strategies.catalog`` (no torch import); a
strategy's implementation is imported only when ``get_strategy``/``strategy_class`` asks for it.
Reports read each strategy's declared ``display`` from here (``display_of``), so a name no
strategy has (an old record) is the report's to render with a fallback, not an error."""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import TYPE_CHECKING

from shardbench.strategies.catalog import CARDS, Display, StrategyCard

if TYPE_CHECKING:
    from shardbench.strategies.base import Strategy

_CARDS: dict[str, StrategyCard] = {card.name: card for card in CARDS}
_ALIASES: dict[str, str] = {a: card.name for card in CARDS for a in card.aliases}


def strategy_names() -> list[str]:
    return list(_CARDS)


def canonical_name(name: str) -> str:
    if name in _CARDS:
        return name
    if name in _ALIASES:
        return _ALIASES[name]
    allowed = ", ".join([*_CARDS, *(f"{a} (= {c})" for a, c in _ALIASES.items())])
    raise ValueError(f"unknown strategy {name!r}; allowed: {allowed}")


def strategy_card(name: str) -> StrategyCard:
    """The declaration of ``name`` (or an alias of it), without importing its implementation."""
    return _CARDS[canonical_name(name)]


def strategy_cards() -> list[StrategyCard]:
    return list(_CARDS.values())


def missing_packages(name: str) -> list[str]:
    """The packages ``name`` needs that are not installed (found without importing them)."""
    return [m for m in strategy_card(name).requires if importlib.util.find_spec(m) is None]


def cuda_only_at(name: str, precision: str = "fp32") -> bool:
    """Whether ``name`` trains at ``precision`` only with ``--device cuda`` here: a CUDA-only
    strategy, one whose fp16 needs CUDA (``fp16_needs_cuda``), or one whose fp16 needs CPU
    kernels this CPU lacks (``fp16_needs_cpu_kernels``), as ``check_runnable`` refuses."""
    card = strategy_card(name)
    if card.cuda_only or (precision == "fp16" and bool(card.fp16_needs_cuda)):
        return True
    return precision == "fp16" and bool(card.fp16_needs_cpu_kernels) and not cpu_has_fp16_kernels()


def check_runnable(name: str, device: str, precision: str = "fp32") -> None:
    """``ValueError`` in one line when ``name`` cannot run here: a package of its extra is not
    installed, it runs (at ``precision``) only on CUDA and the cell is not, or its fp16 needs
    CPU kernels this CPU lacks."""
    card = strategy_card(name)
    if missing := missing_packages(name):
        raise ValueError(
            f"strategy {card.name!r} needs {', '.join(missing)}, which is not installed: install the "
            f"{card.extra!r} extra (bash scripts/setup.sh does, or pip install 'shardbench[{card.extra}]')"
        )
    if card.cuda_only and device != "cuda":
        raise ValueError(
            f"strategy {card.name!r} runs only with --device cuda; allowed on {device}: "
            + ", ".join(c.name for c in CARDS if not c.cuda_only)
        )
    if precision == "fp16" and card.fp16_needs_cuda and device != "cuda":
        raise ValueError(
            f"strategy {card.name!r} trains fp16 only with --device cuda ({card.fp16_needs_cuda}); "
            f"fp16 on {device}: "
            + ", ".join(c.name for c in CARDS if not c.cuda_only and not c.fp16_needs_cuda)
        )
    if precision == "fp16" and card.fp16_needs_cpu_kernels and device == "cpu" and not cpu_has_fp16_kernels():
        raise ValueError(
            f"strategy {card.name!r} cannot train fp16 on this CPU ({card.fp16_needs_cpu_kernels}, and "
            "this CPU has none); allowed here: --precision fp32 or bf16, or fp16 with "
            + ", ".join(
                c.name for c in CARDS if not (c.cuda_only or c.fp16_needs_cuda or c.fp16_needs_cpu_kernels)
            )
        )


@functools.cache
def cpu_has_fp16_kernels() -> bool:
    """Whether oneDNN has fp16 kernels for this CPU (what DeepSpeed's CPU accelerator asks);
    asked once, as the CPU does not change under a process."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError):  # a torch without the query: none assumed
        return False


def strategy_class(name: str) -> type[Strategy]:
    module, cls = strategy_card(name).implementation.split(":")
    return getattr(importlib.import_module(module), cls)


def get_strategy(name: str) -> Strategy:
    return strategy_class(name)()


def strategy_classes() -> list[type[Strategy]]:
    """Every implementation (imports them all, and torch with them)."""
    return [strategy_class(n) for n in _CARDS]


def display_of(name: str) -> Display | None:
    """How reports show ``name`` (an alias shows as its strategy); None for an unknown name."""
    card = _CARDS.get(_ALIASES.get(name, name))
    return card.display if card is not None else None


def reference_strategy() -> str:
    """The baseline every memory saving is measured against (the one declaring ``reference``)."""
    (name,) = [c.name for c in CARDS if c.display.reference]
    return name
