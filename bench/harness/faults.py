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
- ``exit``: the process ends with ``os._exit(3)``, writing nothing, as user code may;
- ``slow:frac=F``: no failure, a measured slowdown: every step of every rank (``rank`` and
  ``step`` do not apply) sleeps ``F`` times the time the step itself took, inside the timed
  region, so the cell's step time grows by the fraction ``F`` whatever the machine's speed.
  It is the measurement hook of the nightly gate's power (``scripts/gate_power.py``: can a
  night see a 15 % slowdown of one strategy?), never something a run sets for itself.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

ENV = "SHARDBENCH_FAULT"
T = TypeVar("T")
KINDS = ("crash", "hang", "nan", "oom", "error", "exit", "slow")
#: the largest slowdown ``slow`` accepts (10x the step's own time): beyond it a typo, not a test
MAX_SLOW = 10.0


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int = 1
    step: int = 0
    strategy: str | None = None
    #: ``slow``: the fraction of a step's own time each step sleeps on top of it
    frac: float = 0.0

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

    def slowed(self, step_fn: Callable[[], T]) -> Callable[[], T]:
        """``step_fn`` itself, or (``slow``) ``step_fn`` followed by a sleep of ``frac`` times the
        seconds it took: a step of t seconds then takes (1 + frac) x t. The step's own time is
        the host's: on CUDA, where kernels run after their launch returns, it is the launch time."""
        if self.kind != "slow":
            return step_fn

        def slowed_step() -> T:
            started = time.perf_counter()
            out = step_fn()
            time.sleep(self.frac * (time.perf_counter() - started))
            return out

        return slowed_step


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
        if kind != "slow" and key in ("rank", "step") and value.isdigit():
            values[key] = int(value)
        elif key == "strategy" and value:
            values[key] = value
        elif kind == "slow" and key == "frac" and _fraction(value) is not None:
            values[key] = _fraction(value)
        else:
            form = (
                "slow:frac=F[:strategy=NAME]" if kind == "slow" else "KIND[:rank=R][:step=S][:strategy=NAME]"
            )
            raise ValueError(f"{ENV}={text!r}: expected {form}, got {option!r}")
    if kind == "slow" and "frac" not in values:
        raise ValueError(
            f"{ENV}={text!r}: slow needs frac=F, a fraction of a step's time in (0, {MAX_SLOW:g}]"
        )
    return Fault(kind, **values)


def _fraction(value: str) -> float | None:
    """``value`` as a slowdown fraction in (0, MAX_SLOW], or None."""
    try:
        frac = float(value)
    except ValueError:
        return None
    return frac if 0.0 < frac <= MAX_SLOW else None
