"""Which unit stage 3 prefetches: the order units ran in the last forward pass.

A unit's all-gather can overlap the compute before it only if it is started before the unit is
needed, so it must be predicted. Like FSDP, we predict from the order the units' forward ran the
last time: in forward, the unit that followed this one; in backward (which runs the forward in
reverse), the unit that preceded it. A wrong guess (a branch skipped this step) costs a gather
that is freed unused, never a wrong result: every unit is still gathered, and waited for, right
before it runs.
"""

from __future__ import annotations


class UnitOrder:
    """Records the units of one forward pass in the order they ran; predicts from the last."""

    def __init__(self) -> None:
        self._running: list[int] = []
        self._order: list[int] = []
        self._after: dict[int, int] = {}
        self._before: dict[int, int] = {}

    def start(self) -> None:
        """A forward pass begins (the root's pre-forward)."""
        self._running = []

    def ran(self, unit: int) -> None:
        self._running.append(unit)

    def finish(self) -> None:
        """A forward pass ended: its order is the one to predict from."""
        self._order, self._running = self._running, []
        self._after, self._before = {}, {}
        for a, b in zip(self._order, self._order[1:], strict=False):
            self._after.setdefault(a, b)  # a unit run twice: its first successor
            self._before[b] = a  # ... and, going backward, its last predecessor

    def first(self) -> int | None:
        return self._order[0] if self._order else None

    def after(self, unit: int) -> int | None:
        return self._after.get(unit)

    def before(self, unit: int) -> int | None:
        return self._before.get(unit)
