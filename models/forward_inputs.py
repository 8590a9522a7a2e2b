"""Whether a model's ``forward`` takes the inputs a ``ModelSpec`` declares, checked before any
rank starts.

A workload of one's own is trained as ``model(**inputs)``: every declared input is passed to
``forward`` by name. An input ``forward`` has no parameter for (``x`` for an ``nn.Sequential``,
whose ``forward`` takes ``input``), a required parameter no input gives, or a parameter
``forward`` takes only by position would fail every cell at its first step, once per rank; here
it is one line that says which names ``forward`` takes. A ``forward(**kwargs)`` takes any name.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable

from torch import nn

_P = inspect.Parameter
#: the parameter kinds an input passed by name can fill
_BY_NAME = (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY)


def check_forward_takes(model: nn.Module, names: Iterable[str], *, workload: str) -> None:
    """ValueError in one line when ``model(**{name: ...})`` cannot call ``model.forward`` with
    ``names``; nothing when it can, or when ``forward`` has no signature to read."""
    names = list(names)
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):  # a builtin or compiled forward: nothing to read it from
        return
    if (problem := mismatch(signature, names)) is not None:
        raise ValueError(
            f"workload {workload!r}: the ModelSpec inputs ({', '.join(names) or 'none'}) do not fit "
            f"{type(model).__name__}.forward, which {problem}; by name, forward takes {takes(signature)}"
        )


def mismatch(signature: inspect.Signature, names: list[str]) -> str | None:
    """What keeps ``names``, passed by name, from calling ``signature``'s function; None if
    nothing does."""
    params = signature.parameters
    any_name = any(p.kind == _P.VAR_KEYWORD for p in params.values())
    by_position = [n for n in names if n in params and params[n].kind == _P.POSITIONAL_ONLY]
    unknown = [n for n in names if n not in params and not any_name]
    unknown += [n for n in names if n in params and params[n].kind in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD)]
    required = (_P.POSITIONAL_ONLY, *_BY_NAME)
    missing = [
        p.name
        for p in params.values()
        if p.kind in required and p.default is _P.empty and (p.name not in names or p.name in by_position)
    ]
    if unknown:
        return f"has no parameter {', '.join(map(repr, unknown))}"
    if by_position:
        return f"takes {', '.join(map(repr, by_position))} only by position (inputs are passed by name)"
    if missing:
        return f"needs {', '.join(map(repr, missing))}, and no input has that name"
    return None


def takes(signature: inspect.Signature) -> str:
    """The names an input may have."""
    params = signature.parameters.values()
    named = [p.name for p in params if p.kind in _BY_NAME]
    if any(p.kind == _P.VAR_KEYWORD for p in params):
        named.append("any other name (**kwargs)" if named else "any name (**kwargs)")
    return ", ".join(named) or "no name"
