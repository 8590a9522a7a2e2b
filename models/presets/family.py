"""Continuous size families: any size of a workload's architecture, named by its shape.

A named ladder (tiny, igpt-s, igpt-m) leaves gaps of up to 14x between sizes, so a max-size
search over it cannot say more than "between 1x and 14x". A family names every shape its knobs
allow (``h832-l20``: hidden 832, 20 layers), so a search can bisect until the largest fit and the
smallest non-fit are within a few percent of each other.

One knob alone is too coarse for that at the sizes the suite measures: a layer of a 12-layer
model is 8% of it, a 64-dim step of width 768 is 17%. A family therefore has two knobs (width in
steps of one attention head, or 8 channels; and depth), and its *members* for a search are every
shape whose aspect (width per layer) stays within a band around the architecture's usual shapes,
sorted by parameter count: neighbours differ by a few percent in parameters and are models of the
same kind. Any shape within the knobs' ranges can still be named and run (``--preset h768-l1``);
the band only decides what a search walks.

Shapes of equal size are not equal in memory: activations grow with depth x width, parameters
with depth x width², so a deep narrow model of 37M parameters can need twice the memory of a
wide shallow one. A search therefore probes, among the members near the size it wants, the one
closest to the architecture's usual proportions (``distance``): its probes follow the family's
spine, and only the last few percent are resolved between neighbours of somewhat different
shape.

Everything here is torch-free: counting a family's thousands of members is arithmetic.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, eq=False)
class SizeFamily:
    """Shapes named by ``spelling`` (e.g. ``"h{hidden}-l{layers}"``), one integer per knob.

    ``knobs`` gives each knob's allowed values (a ``range``: its step is the width granularity);
    ``config`` turns knob values into a preset dict; ``in_band`` says whether a shape is a member
    of the search family (the aspect band); ``distance`` how unusual its proportions are;
    ``param_count`` counts a preset dict's parameters."""

    spelling: str
    knobs: dict[str, range]
    config: Callable[..., dict[str, Any]]
    param_count: Callable[[dict[str, Any]], int]
    in_band: Callable[..., bool] = lambda **_: True
    #: how far a shape is from the architecture's usual proportions (0: on them): of the shapes
    #: near the size a search wants to probe, it probes the most usual one
    distance: Callable[..., float] = lambda **_: 0.0
    described: str = ""

    @functools.cached_property
    def _pattern(self) -> re.Pattern[str]:
        regex = re.escape(self.spelling)
        for knob in self.knobs:
            regex = regex.replace(re.escape("{" + knob + "}"), f"(?P<{knob}>[0-9]+)")
        return re.compile(regex)

    def name(self, **knobs: int) -> str:
        return self.spelling.format(**knobs)

    def parse(self, name: str) -> dict[str, int] | None:
        """The knob values ``name`` spells, or None when it is not a shape of this family (or a
        knob is outside its range or off its step)."""
        m = self._pattern.fullmatch(name)
        if not m:
            return None
        knobs = {k: int(v) for k, v in m.groupdict().items()}
        return knobs if all(knobs[k] in allowed for k, allowed in self.knobs.items()) else None

    def preset(self, name: str) -> dict[str, Any] | None:
        knobs = self.parse(name)
        return None if knobs is None else self.config(**knobs)

    def help(self) -> str:
        """How to spell a size, for error messages and ``shardbench list``."""
        ranges = ", ".join(f"{k} {r.start}..{r[-1]} in steps of {r.step}" for k, r in self.knobs.items())
        return f"{self.spelling} ({ranges})" + (f"; {self.described}" if self.described else "")

    @functools.cached_property
    def members(self) -> tuple[tuple[int, str], ...]:
        """(parameters, name) of every in-band shape, smallest first; of shapes with the same
        count, the first in knob order stands for them."""
        seen: dict[int, str] = {}
        for knobs in self._grid():
            if self.in_band(**knobs):
                count = self.param_count(self.config(**knobs))
                seen.setdefault(count, self.name(**knobs))
        return tuple(sorted(seen.items()))

    def _grid(self) -> Iterator[dict[str, int]]:
        combos: list[dict[str, int]] = [{}]
        for knob, allowed in self.knobs.items():
            combos = [dict(c, **{knob: v}) for c in combos for v in allowed]
        yield from combos


class Presets(Mapping[str, dict[str, Any]]):
    """A workload's presets: the named ones (iterated, listed, shown in tables) and, looked up by
    name, any shape of its family. ``"h832-l20" in presets`` is true; ``list(presets)`` is the
    named ones only. A named preset wins over a family shape of the same spelling."""

    def __init__(self, named: dict[str, dict[str, Any]], family: SizeFamily | None = None) -> None:
        self.named, self.family = named, family

    def __getitem__(self, name: str) -> dict[str, Any]:
        if name in self.named:
            return self.named[name]
        preset = self.family.preset(name) if self.family else None
        if preset is None:
            raise KeyError(name)
        return preset

    def __iter__(self) -> Iterator[str]:
        return iter(self.named)

    def __len__(self) -> int:
        return len(self.named)

    def allowed(self) -> str:
        """What a preset may be called, for an error message."""
        named = ", ".join(self.named)
        return f"{named}, or a family size {self.family.help()}" if self.family else named
