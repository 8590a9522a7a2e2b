"""Training steps run under the memory probe, for tests of what it books."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from shardbench.metrics.memory import MemoryProbe


def tracked_peak(
    external: Sequence[Any], inputs: list[torch.Tensor], step: Callable[[torch.Tensor], None]
) -> tuple[int, dict[str, int]]:
    """The probe's CPU peak and breakdown over ``step(x)`` for each of ``inputs``, one step
    apart as the harness ends them; ``external`` (modules, optimizers) exist before tracking."""
    probe = MemoryProbe(torch.device("cpu"), [*external, inputs])
    with probe:
        for i, x in enumerate(inputs):
            if i:
                probe.next_step()
            step(x)
    return probe.peak()
