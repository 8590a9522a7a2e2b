"""Fault injection, so every failure path of the harness is covered by a test, not by hand.

``SHARDBENCH_FAULT=KIND[:rank=R][:step=S][:strategy=NAME]`` (read only by the worker) makes rank
R (default 1) fail at step S (default 0; warm-up steps count, from 0), in every cell or only in
cells of strategy NAME; several faults are separated by commas (one run can then exercise every
failure path, one strategy each). The kinds:

- ``crash``: the process kills itself with SIGKILL, as the OOM killer or a segfault would;
- ``hang``: the rank stops making progress (its peers block in the next collective);
- ``nan``: the loss of that step becomes NaN (the cell must end as ``diverged``);
- ``oom``: ``torch.OutOfMemoryError`` is raised, as the CUDA allocator would;
- ``error``: a ``RuntimeError`` is raised;
- ``exit``: the process ends with ``os._exit(3)``, writing nothing, as user code may.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

ENV = "SHARDBENCH_FAULT"
KINDS = ("crash", "hang", "nan", "oom", "error", "exit")


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int = 1
    step: int = 0
    strategy: str | None = None

    def applies_to(self, strategy: str) -> bool:
        return self.strategy is None or self.strategy == strategy

    def due(self, *, rank: int, step: int) -> bool:
        return rank == self.rank and step == self.step

    def before_step(self, *, rank: int, step: int) -> None:
        """Fail now if this fault is due and is not about the loss."""
        if not self.due(rank=rank, step=step):
            return
        if self.kind == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.kind == "hang":
            while True:
                time.sleep(3600)
        elif self.kind == "oom":
            raise torch.OutOfMemoryError(f"injected out of memory ({ENV}) on rank {rank} at step {step}")
        elif self.kind == "error":
            raise RuntimeError(f"injected error ({ENV}) on rank {rank} at step {step}")
        elif self.kind == "exit":
            os._exit(3)

    def poisons_loss(self, *, rank: int, step: int) -> bool:
        return self.kind == "nan" and self.due(rank=rank, step=step)


def faults_from_env(environ: Mapping[str, str] = os.environ) -> list[Fault]:
    """The faults ``SHARDBENCH_FAULT`` asks for (none when unset); ``ValueError`` if unreadable."""
    text = environ.get(ENV, "").strip()
    return [_parse(item.strip(), text) for item in text.split(",") if item.strip()]


def _parse(item: str, text: str) -> Fault:
    kind, *options = item.split(":")
    if kind not in KINDS:
        raise ValueError(f"{ENV}={text!r}: unknown fault {kind!r}; allowed: {', '.join(KINDS)}")
    values: dict[str, Any] = {}
    for option in options:
        key, _, value = option.partition("=")
        if key in ("rank", "step") and value.isdigit():
            values[key] = int(value)
        elif key == "strategy" and value:
            values[key] = value
        else:
            raise ValueError(
                f"{ENV}={text!r}: expected KIND[:rank=R][:step=S][:strategy=NAME], got {option!r}"
            )
    return Fault(kind, **values)
