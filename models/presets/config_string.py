"""A model's shape as one preset string, for the workloads whose shapes are keyword arguments
(``hf:<Arch>`` config fields, a factory's keywords): ``key=value`` items joined by ``:``, or
``default`` for none. ``--model-config`` (commas, as elsewhere on the command line) writes it, so
every record names the exact shape it measured, as the built-in size families' names do.

``depth_family`` makes such a workload searchable by ``max-size --vary params`` and the claim:
every depth of the user's own shape, the width and everything else as given. One knob is coarse
(a layer of a 22-layer model is ~4% of it), and a search reports neighbouring depths as its
bracket when they are further apart than ``--resolution``; but it never invents a width the user
did not ask for (widths are tied to head counts, intermediate sizes, ... in ways a generic
family cannot know). Torch-free, like the other families.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from shardbench.models.presets.family import SizeFamily

DEFAULT_PRESET = "default"
SEPARATOR = ":"
#: the deepest model a depth family names (a search never gets near it: the analytic ceiling,
#: model states alone over the budget, stops it first)
MAX_DEPTH = 4096


def parse_model_config(text: str) -> dict[str, Any]:
    """``"hidden_size=64:num_hidden_layers=2"`` (or with commas) -> ``{"hidden_size": 64, ...}``;
    values are Python literals (ints, floats, True/False, None) or else strings."""
    if text.strip() in ("", DEFAULT_PRESET):
        return {}
    out: dict[str, Any] = {}
    for item in text.replace(",", SEPARATOR).split(SEPARATOR):
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key or not raw:
            raise ValueError(f"model config item {item.strip()!r} is not key=value (e.g. hidden_size=2048)")
        if key in out:
            raise ValueError(f"model config key {key!r} is given twice; give each key once")
        words = {"true": True, "false": False, "none": None, "null": None}
        try:
            out[key] = words[raw.lower()] if raw.lower() in words else ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            out[key] = raw
    return out


def format_model_config(config: dict[str, Any]) -> str:
    """The preset string of ``config`` (``parse_model_config``'s inverse); ``default`` if empty."""
    return SEPARATOR.join(f"{k}={v}" for k, v in config.items()) or DEFAULT_PRESET


class KeywordPresets(dict):
    """The ``presets`` of a workload whose shapes are keyword arguments: ``default`` (listed),
    and, looked up, any ``key=value:...`` that ``check`` accepts (it raises ValueError if not)."""

    def __init__(self, check: Callable[[str], object], allowed: Callable[[], str]) -> None:
        super().__init__({DEFAULT_PRESET: {}})
        self._check, self._allowed = check, allowed

    def __getitem__(self, preset: str) -> dict[str, Any]:
        if preset not in self:
            raise KeyError(preset)
        return parse_model_config(preset)

    def __contains__(self, preset: object) -> bool:
        try:
            self._check(str(preset))
        except ValueError:
            return False
        return True

    def allowed(self) -> str:
        return self._allowed()


def depth_family(around: str, knob: str, count: Callable[[str], int]) -> SizeFamily:
    """Every depth (``knob`` = 1 .. ``MAX_DEPTH``) of the shape the preset ``around`` names.

    ``count(preset)`` counts a preset's parameters (a meta build). A model that repeats one
    block per unit of depth has a count affine in it; that is checked at depths 1, 2 and 3 and
    then used for every member (a meta build of each of 4096 depths would take minutes). A count
    that is not affine (the factory's blocks differ with depth) is refused: name a ``--ladder``.
    """
    base = parse_model_config(around)
    # the knob keeps its place in the user's order, or goes last
    spelling = format_model_config({**base, knob: "{" + knob + "}"})
    name = lambda depth: spelling.format(**{knob: depth})  # noqa: E731
    c1, c2, c3 = (count(name(d)) for d in (1, 2, 3))
    if c3 - c2 != c2 - c1 or c2 <= c1:
        raise ValueError(
            f"the parameters of {around!r} are not affine in {knob!r} ({c1:,}, {c2:,}, {c3:,} at depths "
            "1, 2, 3): no depth family to search; give --ladder"
        )
    per_block = c2 - c1
    return SizeFamily(
        spelling=spelling,
        knobs={knob: range(1, MAX_DEPTH + 1)},
        config=lambda **knobs: {**base, **knobs},
        param_count=lambda config: c1 + (config[knob] - 1) * per_block,
        described=f"the depth of {around!r}, {per_block:,} parameters per {knob}",
    )
