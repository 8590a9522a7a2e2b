"""How every rank sees the parameters a step updated: one interface, one part per kind of stage.

The step updates only this rank's chunk of each bucket. Where parameters stay whole on every
rank (stages 1 and 2), the updated chunks are all-gathered into the flat buffers, bucket by
bucket while the next bucket is updated (``GatherAfterStep``). Where they are sharded (stage 3),
the chunk is all a rank keeps: the wrapper's unit gatherer gathers each unit when it next runs,
so the step gathers nothing (``GatheredByUnits``).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.distributed as dist

from shardbench.strategies.sharded.groups import held_weakly
from shardbench.strategies.sharded.profiling import profiled


class ParameterSync(Protocol):
    """What the optimizer's step calls once each bucket's chunk holds its new values."""

    #: whether each rank keeps only its chunk of the parameters (the flat buffers hold no
    #: storage between uses): the optimizer then lays its chunks out as tensors of their own
    shards_parameters: bool

    def updated(self, flat: torch.Tensor, chunk: torch.Tensor, label: str) -> None:
        """``chunk`` (this rank's part of ``flat``) holds its bucket's new values; ``label``
        names the profiler regions (``shardbench::<label>::gather``)."""

    def finish(self, label: str) -> None:
        """End of the step: what ``updated`` started is complete (also when the step raised)."""


class GatherAfterStep:
    """Stages 1-2: all-gather each updated chunk into its flat buffer, asynchronously, and wait
    for all of them at the end of the step: none may outlive it, or it could still be running
    when the process group is destroyed."""

    shards_parameters = False

    def __init__(self, process_group: Any, world_size: int) -> None:
        self._group = held_weakly(process_group)
        self.world_size = world_size
        self._works: list[Any] = []

    def updated(self, flat: torch.Tensor, chunk: torch.Tensor, label: str) -> None:
        if self.world_size > 1:
            with profiled(f"shardbench::{label}::gather"):
                work = dist.all_gather_into_tensor(flat, chunk, group=self._group(), async_op=True)
            self._works.append(work)

    def finish(self, label: str) -> None:
        works, self._works = self._works, []
        with profiled(f"shardbench::{label}::gather"):
            for w in works:
                w.wait()


class GatheredByUnits:
    """Stage 3: the chunk is this rank's copy of its parameters; the wrapper's unit gatherer
    gathers each unit when it runs, so the step itself gathers nothing."""

    shards_parameters = True

    def updated(self, flat: torch.Tensor, chunk: torch.Tensor, label: str) -> None:
        pass

    def finish(self, label: str) -> None:
        pass
