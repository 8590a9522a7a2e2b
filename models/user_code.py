"""Calls into a user's own code (a factory, its module, ``ModelSpec.build``): an exit it asks
for is an error naming the code it exited with, never the command's own exit. A factory that
calls ``sys.exit(0)`` would otherwise end ``shardbench run`` with exit 0, nothing measured, and
a CI job reading success."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def no_exit(what: str) -> Iterator[None]:
    """Turn a ``SystemExit`` raised inside into a ``ValueError`` naming ``what`` and its code."""
    try:
        yield
    except SystemExit as e:
        raise ValueError(
            f"{what} called sys.exit({e.code!r}): your code must return (raise an exception to fail)"
        ) from None
