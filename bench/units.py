"""How a size or a parameter count reads, in every command: one formatter, so ``plan``,
``max-size``, ``claim`` and ``run`` never print the same figure two ways.

A lone figure takes the unit that keeps three significant figures (``8.00 MiB``, ``133 MiB``,
``1.36 GiB``): a budget of 8 MiB never reads ``0.01 GiB``. A table column takes one unit for
every row (``size_unit``), chosen by its largest figure, as the plan table does: peaks of a few
MiB within a 1 GiB budget read ``5.3``, never ``0.01``. Two ends of a bracket
(a largest fit and a smallest misfit) that differ never print equal: ``apart`` adds digits
until they do not.
"""

from __future__ import annotations

import math
from collections.abc import Callable

KIB, MIB, GIB, TIB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
_UNITS = ((TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB"))


def _figures(value: float, significant: int) -> str:
    """``value`` with ``significant`` figures, in plain notation (no ``e+03``)."""
    if value == 0:
        return "0"
    rounded = float(f"{value:.{significant}g}")  # 99.96 -> 100, which needs one decimal less
    decimals = max(0, significant - 1 - math.floor(math.log10(abs(rounded))))
    return f"{rounded:.{decimals}f}"


def size_text(nbytes: int | float | None, *, extra: int = 0) -> str:
    """A lone size in the unit that keeps three significant figures (``extra`` more); "?" when
    unknown."""
    if nbytes is None:
        return "?"
    # from 1000 of a unit up, the next unit keeps the figures to three (0.996 GiB, not 1020 MiB)
    unit, label = next(((u, name) for u, name in _UNITS if abs(nbytes) >= u * 1000 / 1024), (1, "B"))
    if unit == 1:
        return f"{nbytes:.0f} B"
    return f"{_figures(nbytes / unit, 3 + extra)} {label}"


def size_unit(largest: int) -> tuple[int, str]:
    """GiB, or MiB under 1 GiB: the unit of every size in a table whose largest figure (of those
    it is read for) is ``largest``."""
    return (GIB, "GiB") if largest >= GIB else (MIB, "MiB")


def in_unit(nbytes: int | None, unit: int, *, extra: int = 0) -> str:
    """A size as a number of ``unit`` for a table column ("-" when unknown): two decimals of a
    GiB, one of a MiB (``extra`` more)."""
    if nbytes is None:
        return "-"
    return f"{nbytes / unit:.{(2 if unit == GIB else 1) + extra}f}"


def params_text(n: int | None, *, extra: int = 0) -> str:
    """A parameter count with three significant figures (``extra`` more) and its scale:
    ``1.1B``, ``110M``, ``512K``; "?" when unknown."""
    if not n:
        return "?"
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.{3 + extra}g}{suffix}"
    return str(n)


def count_text(value: float) -> str:
    """A count or a rate with three significant figures and its scale, so that a column of them
    stays narrow: ``51.5M``, ``6.44M``, ``33.4K``, ``478``."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= scale * 0.9995:  # 999.6 reads 1.00K, not 1000
            return f"{_figures(value / scale, 3)}{suffix}"
    return _figures(value, 3)


def apart(text: Callable[..., str], a: int | float | None, b: int | float | None) -> tuple[str, str]:
    """``text(a)`` and ``text(b)``, with as many extra digits as it takes for two different
    values to read differently (equal values read equal)."""
    for extra in range(6):
        left, right = text(a, extra=extra), text(b, extra=extra)
        if left != right or a == b:
            return left, right
    return left, right


def seconds_text(seconds: float, *, signed: bool = False) -> str:
    """A duration in the unit that keeps three figures readable: "2.47 s", "621 ms", "538 µs"."""
    size = abs(seconds)
    value, unit = next(
        ((seconds / scale, name) for scale, name in ((1, "s"), (1e-3, "ms"), (1e-6, "µs")) if size >= scale),
        (seconds / 1e-6, "µs"),
    )
    return f"{'+' if signed and seconds >= 0 else ''}{_figures(value, 3)} {unit}"
