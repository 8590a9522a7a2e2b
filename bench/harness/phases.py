"""The phases of one rank's cell, each a function over the same ``CellSteps``: warm-up and timed
steps (``time_steps``), memory by category (``measure_memory``), one profiled step
(``trace_step``).

Timing and memory tracking are separate phases on purpose: the memory tracker is a dispatch mode
that slows every op, so timed steps run without it. Every phase advances one step counter, so a
failure names the step it happened in (warm-up steps count, from 0) and synthetic batches never
repeat across phases.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from shardbench.harness import drilldown
from shardbench.harness.config import CellConfig
from shardbench.harness.faults import Fault
from shardbench.harness.job import node_size
from shardbench.metrics.comm import CollectiveCounter
from shardbench.metrics.kernels import KernelWatch
from shardbench.metrics.memory import MemoryProbe, cuda_allocator_stats, reset_cuda_peaks
from shardbench.metrics.timing import timed
from shardbench.models.base import concat_inputs

MEMORY_STEPS = 2  # steady-state steps tracked for the breakdown (optimizer state exists by then)


class Diverged(ArithmeticError):
    """The loss stopped being a finite number."""

    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"loss is {loss} at step {step} (warm-up steps count, from 0)")
        self.step = step


class StepFailed(Exception):
    """A failure inside step ``step``; carries the step for the record."""

    def __init__(self, step: int, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.step, self.cause = step, cause


@dataclass
class CellSteps:
    """One rank's training steps of a cell: the wrapped model and optimizer, the data ranks this
    process trains (dp drives several devices from one process; a simulated world's one
    process is rank 0 and trains rank 0's data only), and the step counter."""

    cell: CellConfig
    strategy: Any
    workload: Any
    model: torch.nn.Module
    optimizer: Any
    device: torch.device
    rank: int
    data_ranks: range
    #: the dtype forward runs under autocast in; None: no autocast
    autocast_dtype: torch.dtype | None
    fault: Fault | None
    step: int = 0

    def batch(self, step: int | None = None) -> Any:
        """The inputs of ``step`` (default: the next one), every data rank's slice together."""
        c, step = self.cell, self.step if step is None else step
        return concat_inputs(
            [
                self.workload.batch(
                    c.preset, c.batch_size, seed=c.seed, step=step, rank=r, device=self.device
                )
                for r in self.data_ranks
            ]
        )

    def loss(self, model: torch.nn.Module, inputs: Any) -> torch.Tensor:
        autocast = (
            torch.autocast(self.device.type, dtype=self.autocast_dtype)
            if self.autocast_dtype is not None
            else contextlib.nullcontext()
        )
        with autocast:
            loss = self.workload.loss(model, inputs)
        if self.fault is not None and self.fault.poisons_loss(rank=self.rank, step=self.step):
            loss = loss * float("nan")
        return loss

    def run(self, inputs: Any, *, timing: bool = False) -> tuple[float | None, float]:
        """One training step on ``inputs``: its checked loss and, when ``timing``, its seconds."""
        if self.fault is not None:
            self.fault.before_step(rank=self.rank, step=self.step)
        step_fn = functools.partial(self.strategy.train_step, self.model, self.optimizer, inputs, self.loss)
        if self.fault is not None:  # ``slow``: the step, then a sleep in proportion (timed with it)
            step_fn = self.fault.slowed(step_fn)
        loss, seconds = timed(step_fn, self.device) if timing else (step_fn(), 0.0)
        value = self._checked(loss)
        self.step += 1
        return value, seconds

    def _checked(self, loss: torch.Tensor) -> float | None:
        """The loss as a float, or Diverged. Fake tensors have no value; in a simulated world the
        collectives move no data (gathered parameters are whatever memory held), so its numbers
        say nothing about convergence and are not checked."""
        if self.cell.fake:
            return None
        value = float(loss)
        if not math.isfinite(value) and not self.cell.simulate:
            raise Diverged(self.step, value)
        return value


@dataclass
class Timing:
    step_times: list[float] = field(default_factory=list)
    #: per timed step on a CPU, the seconds of its forward, backward and optimizer step
    phases: list[dict[str, float]] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)
    cuda_allocator: dict[str, Any] | None = None
    #: seconds the first warm-up step took (a kernel or op built just in time, a cold cache)
    first_step_s: float | None = None
    #: fp16: warm-up steps added because the loss scaler skipped the last one (its scale still
    #: backing off from the initial one), and the steps it skipped in warm-up and timed steps
    warmup_added: int = 0
    skipped_warmup: int = 0
    skipped_timed: int = 0


#: the most warm-up steps a loss scaler still backing off may add: its default initial scale,
#: 2^16, halved this often reaches 2^-24, below which no finite fp16 gradient overflows
SCALER_SETTLE_STEPS = 40


def time_steps(steps: CellSteps) -> Timing:
    """Warm-up, then the timed steps. Under ``--fake`` nothing is timed (fake tensors have no
    values), so warm-up is skipped too: the memory phase's tracked steps include the first
    (optimizer state created) and a steady one, which is all it needs."""
    cell, out, strategy = steps.cell, Timing(), steps.strategy
    for i in range(0 if cell.fake else cell.warmup):
        started = time.perf_counter()
        steps.run(steps.batch())  # (its loss is read back: on CUDA the step has finished)
        if i == 0:
            out.first_step_s = time.perf_counter() - started
    # fp16: a skipped step updates nothing (no optimizer state the first time), so timing it or
    # tracking its memory would measure another step; warm up until the scaler takes one. The
    # ranks agree on every skip, so each runs the same steps.
    while strategy.last_step_skipped and out.warmup_added < SCALER_SETTLE_STEPS:
        steps.run(steps.batch())
        out.warmup_added += 1
    out.skipped_warmup = strategy.skipped_steps
    reset_cuda_peaks(steps.device)
    # the phases of the timed steps, on a CPU (where an op has run when its call returns; a GPU
    # would need a synchronisation between phases, which would change the step it times)
    strategy.phase_clock = out.phases if steps.device.type == "cpu" else None
    try:
        for _ in range(0 if cell.fake else cell.steps):
            loss, seconds = steps.run(steps.batch(), timing=True)
            out.step_times.append(seconds)
            out.losses.append(loss)
    finally:
        strategy.phase_clock = None
    out.skipped_timed = strategy.skipped_steps - out.skipped_warmup
    out.cuda_allocator = cuda_allocator_stats(steps.device)
    return out


@dataclass
class Memory:
    peak: int | None = None
    breakdown: dict[str, int] | None = None
    model_state: dict[str, int] | None = None
    comm: dict[str, Any] | None = None
    kernels: dict[str, str] | None = None


def measure_memory(steps: CellSteps, world_size: int, artifacts: dict[str, str]) -> Memory:
    """``MEMORY_STEPS`` steady steps under the memory tracker: the peak and its breakdown, the
    model states a rank keeps after a step, the collectives of the last step and the kernels
    that ran. Inputs are made before tracking starts, so they count as "other", not
    activations."""
    cell, device, strategy = steps.cell, steps.device, steps.strategy
    inputs = [steps.batch(steps.step + i) for i in range(MEMORY_STEPS)]
    by_module = cell.memory_snapshot and not drilldown.uses_allocator_history(cell, device)
    # a peer's own optimizer object (DeepSpeed's) is no torch Optimizer: the strategy types what
    # it holds (memory_tensors)
    optimizer = steps.optimizer if isinstance(steps.optimizer, torch.optim.Optimizer) else None
    probe = MemoryProbe(
        device, [steps.model, optimizer, inputs], typed=strategy.memory_tensors(), per_module=by_module
    )
    strategy.observe_memory(probe.attribute)
    watch, out = KernelWatch(), Memory()
    with drilldown.allocator_history(cell, device, steps.rank, artifacts), probe, watch.watching_steps():
        # the ranks a node holds as the command's process resolved them into the cell, never
        # this rank's own LOCAL_WORLD_SIZE (``job_ranks_per_node``)
        counter = CollectiveCounter(world_size, node_size(cell.ranks_per_node, world_size))
        for i, step_inputs in enumerate(inputs):
            if i:  # (not after the last: its module stats are --memory-snapshot's table)
                probe.next_step()
            # the collectives of one steady step (the last), counted, never timed
            with counter if i == len(inputs) - 1 else contextlib.nullcontext():
                steps.run(step_inputs)
        out.comm = counter.summary()
        # after a step, before the next zero_grad: exactly the model states a rank keeps
        out.model_state = probe.current_model_state()
    del inputs
    out.kernels = watch.summary()
    strategy.observe_memory(None)
    out.peak, out.breakdown = probe.peak()
    if by_module:
        drilldown.write_module_table(cell, probe.tracker, steps.rank, artifacts)
    return out


def trace_step(steps: CellSteps, artifacts: dict[str, str]) -> dict[str, float] | None:
    """One more step, profiled into a Chrome trace; the measured steps stay unprofiled."""
    inputs = steps.batch()
    run: Callable[[], object] = lambda: steps.run(inputs)  # noqa: E731
    return drilldown.trace_one_step(steps.cell, steps.device, steps.rank, run, artifacts)
