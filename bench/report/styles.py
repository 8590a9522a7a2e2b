"""How each strategy looks in a report (place, colour, role), read from the strategy registry.

Strategies declare their ``Display`` (bench/strategies/base.py) and the report only reads it, so
a new strategy shows up right without a report edit. Records may name a strategy the registry
does not know (an old run, a renamed strategy): it still renders, after the known ones, in a
colour derived from its name, so the same name keeps the same colour from report to report.
"""

from __future__ import annotations

from shardbench.strategies.registry import display_of

#: colours for names the registry does not know; none of them is a declared strategy's
FALLBACK_COLORS = ("#756bb1", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
_UNKNOWN_ORDER = 1_000_000  # after every declared strategy

def strategy_key(name: str) -> tuple[int, str]:
    """Sort key: the declared order, unknown names last (alphabetically)."""
    display = display_of(_strategy(name))
    return (display.order if display else _UNKNOWN_ORDER, name)


def strategy_color(name: str) -> str:
    display = display_of(_strategy(name))
    return display.color if display else FALLBACK_COLORS[sum(map(ord, name)) % len(FALLBACK_COLORS)]


def legend_label(series: str, strategy: str) -> str:
    """A legend entry: the series, with the strategy's role where declared ("zero2 (ours)")."""
    display = display_of(_strategy(strategy))
    return f"{series} ({display.role})" if display else series


#: how a series that shards in groups is told from its strategy's flat one, which has its colour
GROUPED_HATCH = "//"


def hatch(series: str) -> str | None:
    """The hatching of a series that shards in groups (``zero3 S=2``); None for any other."""
    return GROUPED_HATCH if _strategy(series) != series else None


def line_marker(series: str) -> str:
    """A line's marker: a square for a series that shards in groups, the default circle else."""
    return "s" if hatch(series) else "o"


def _strategy(series: str) -> str:
    """The strategy of a series labelled with its shard width (``records.strategy_label``)."""
    return series.split(" S=")[0]
