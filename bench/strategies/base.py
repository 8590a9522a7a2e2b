"""The strategy interface: how a distribution method wraps a model and its optimizer.

The harness never branches on a strategy's name. What differs between strategies is expressed
here: ``setup`` wraps the model and builds the optimizer, ``train_step`` runs one step (the
default is forward, backward, step), ``sharding`` declares what is partitioned across ranks (the
analytic prediction follows from it), ``display`` declares how reports show the strategy,
``plan_world`` says how many ranks/devices a request really gets, and ``settings`` is recorded
verbatim so every record states how the strategy was configured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from shardbench.metrics.analytic import Communication, Sharding
from shardbench.precision import compute_dtype, loss_scaled
from shardbench.strategies.catalog import Display, Role, StrategyCard, WorldPlan

__all__ = ["Display", "Role", "WorldPlan", "RankContext", "Strategy", "OptimizerFactory", "LossFn"]

#: builds the optimizer for an (unwrapped) model; sharded strategies read its class, groups and
#: hyperparameters and rebuild it over their shards.
OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]
LossFn = Callable[[nn.Module, Any], torch.Tensor]


@dataclass(frozen=True)
class RankContext:
    """Where this rank runs: its place in the world and its device."""

    rank: int
    world_size: int
    device: torch.device
    #: the default process group, or None for single-process strategies (dp).
    process_group: dist.ProcessGroup | None = None
    precision: str = "fp32"
    #: the modules the workload asks parameter-sharding strategies (zero3, FSDP2) to gather as
    #: units (``Workload.shard_units``); None: each strategy's default wrapping
    shard_units: tuple[nn.Module, ...] | None = None
    #: hybrid sharding: shard within groups of this many ranks, replicate across the N/S groups
    #: (a strategy whose card takes ``shard_group``); None: over all N
    shard_group: int | None = None


class _ShardingView:
    """A read-only ``shards_*`` flag that reads ``sharding``, on the class and on instances, so
    code that asks "does it shard X?" keeps working while the declaration stays in one place."""

    def __init__(self, field: str) -> None:
        self.field = field

    def __get__(self, obj: object, owner: type[Strategy]) -> bool:
        return getattr(owner.sharding, self.field)

    def __set__(self, obj: object, value: object) -> None:
        raise AttributeError(f"read-only: declare sharding = Sharding({self.field}=...) instead")


SIMULATED_NOTE = (
    "simulated: rank 0 of a fake world (collectives move no data); memory is real, "
    "step time excludes communication (and fp16 loss scaling, which would read its garbage as an "
    "overflow), numerics are not comparable"
)


class PhaseClock:
    """Times a step's phases into ``into`` (a strategy's ``phase_clock``), each ``mark`` ending
    the phase named since the last; with ``into`` None it does nothing. On a CPU the ops have
    run when the call returns; the step's collectives waited on inside a phase count in it."""

    def __init__(self, into: list[dict[str, float]] | None) -> None:
        self.into = into
        self.seconds: dict[str, float] = {}
        self.last = time.perf_counter() if into is not None else 0.0
        if into is not None:
            into.append(self.seconds)

    def mark(self, phase: str) -> None:
        if self.into is not None:
            now = time.perf_counter()
            self.seconds[phase] = now - self.last
            self.last = now


class Strategy:
    """Base class: override ``setup`` (and ``train_step`` only if the default does not fit).

    A concrete strategy names its declaration: ``class DDPStrategy(Strategy, card="ddp")``."""

    name: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    description: ClassVar[str] = ""
    #: what is partitioned across ranks; the analytic memory prediction is computed from it
    sharding: ClassVar[Sharding]
    #: how reports order, colour and label it
    display: ClassVar[Display]
    #: read-only views of ``sharding``, for code that asks "does it shard X?"
    shards_optimizer_state = _ShardingView("optimizer_state")
    shards_gradients = _ShardingView("gradients")
    shards_parameters = _ShardingView("parameters")
    #: can run as rank 0 of a fake world of N (simulated world sizes).
    simulatable: ClassVar[bool] = True
    #: needs torch.distributed initialised in every rank.
    needs_process_group: ClassVar[bool] = True

    #: the declaration this class implements (``shardbench.strategies.catalog``)
    card: ClassVar[StrategyCard]
    #: the gradient scaler of this rank's training (``loss_scaler``), set once it is set up
    scaler: Any = None
    #: fp16: the steps the loss scaler skipped so far (an inf or NaN gradient: no update, the
    #: scale backed off), and whether the last one was; the ranks agree on both
    skipped_steps: int = 0
    last_step_skipped: bool = False
    #: where a step's phases are timed (the timed steps on a CPU, ``phases.time_steps``): one
    #: entry per step, the seconds of its forward, backward and optimizer step; None: untimed
    phase_clock: list[dict[str, float]] | None = None

    def __init_subclass__(cls, card: str | None = None, **kwargs: Any) -> None:
        """``class X(Strategy, card="name")`` takes name, aliases, description, sharding, display
        and the capability flags from the catalog's card of that name: one declaration, which
        ``shardbench list`` and reports read without importing torch."""
        super().__init_subclass__(**kwargs)
        if card is not None:
            from shardbench.strategies.catalog import CARDS

            found = next((c for c in CARDS if c.name == card), None)
            if found is None:
                raise TypeError(
                    f"{cls.__name__}: no strategy card named {card!r} in bench/strategies/catalog.py"
                )
            cls.card = found
            cls.name, cls.aliases, cls.description = found.name, found.aliases, found.description
            cls.sharding, cls.display = found.sharding, found.display
            cls.simulatable, cls.needs_process_group = found.simulatable, found.needs_process_group
        views = [n for n, v in vars(Strategy).items() if isinstance(v, _ShardingView)]
        if stale := [n for n in views if n in vars(cls)]:  # it would shadow the view and disagree
            raise TypeError(f"{cls.__name__} sets {', '.join(stale)}: declare its sharding = Sharding(...)")

    def plan_world(
        self, requested: int, device_type: str, simulate: bool = False, *, devices: int | None = None
    ) -> WorldPlan:
        """What ``requested`` ranks become here. ``devices``: how many ranks with a device each
        the world can have (a torchrun or Slurm job's processes); None: this host's GPUs."""
        if simulate:
            if not self.simulatable:
                raise ValueError(
                    f"strategy {self.name!r} cannot run as a simulated world (--simulate, --fake): "
                    + self.card.not_simulatable_because
                )
            return WorldPlan(processes=1, world_size=requested, note=SIMULATED_NOTE, simulated=True)
        if devices is None and device_type == "cuda" and torch.cuda.is_available():
            devices = torch.cuda.device_count()
        if device_type == "cuda" and devices is not None and requested > devices:
            raise ValueError(
                f"strategy {self.name!r} on cuda needs one GPU per rank: world size {requested} > "
                f"{devices} visible devices"
            )
        return WorldPlan(processes=requested, world_size=requested)

    def settings(self) -> dict[str, Any]:
        """How this strategy is configured; stored in every record."""
        return {}

    def kept_sharding(self) -> Sharding:
        """What a rank keeps sharded between steps, where the model states are measured: its
        ``sharding``, unless it holds more whole during a step than after it."""
        return self.sharding

    def model_state_shards(self, world_size: int, shard_group: int | None) -> int:
        """The ranks each sharded model state is divided among between steps: the shard
        group's S where it shards in groups (hybrid sharding), else all N."""
        return shard_group or world_size

    def model_state_precision(self, precision: str) -> str:
        """The precision model states are stored in when training at ``precision``: the default
        (autocast over fp32 parameters) keeps fp32 states, so "fp32" either way."""
        return "fp32"

    def communication(self, precision: str, backend: str) -> Communication | None:
        """What a step of this strategy communicates at ``precision`` on ``backend`` ("gloo",
        "nccl", "fake"), for the analytic volume (``bench/metrics/analytic.py``); None: it issues
        no c10d collectives (dp, a single device)."""
        return None

    def prepare_precision(self, model: nn.Module, precision: str) -> tuple[nn.Module, torch.dtype | None]:
        """Ready ``model`` for ``precision``; returns it and the dtype to run forward under
        autocast in (None: no autocast). The default keeps fp32 parameters and autocasts to the
        precision's 16-bit dtype (PyTorch's recommended mixed precision for DDP); strategies that
        keep 16-bit parameters or run their own mixed precision override it."""
        return model, compute_dtype(precision)

    def loss_scaler(self, optimizer: Any, ctx: RankContext) -> torch.amp.GradScaler | None:
        """The gradient scaler ``train_step`` scales the loss with at ``ctx.precision`` (None:
        unscaled). fp16 gets ``torch.amp.GradScaler``, as PyTorch documents for DDP; a
        strategy whose gradients torch's scaler cannot see, or whose library scales its own
        loss, overrides it."""
        return torch.amp.GradScaler(ctx.device.type) if loss_scaled(ctx.precision) else None

    def init_world(self, ctx: RankContext) -> None:
        """Create what must exist before any model tensor (e.g. a device mesh). Called outside
        FakeTensorMode under ``--fake``: objects made from real values (a mesh's rank map) cannot
        be built from fake tensors."""

    def setup(
        self, model: nn.Module, optimizer_factory: OptimizerFactory, ctx: RankContext
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        raise NotImplementedError

    def train_step(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, inputs: Any, loss_fn: LossFn
    ) -> torch.Tensor:
        """One step. Gradients are cleared first, so after the step they still exist and a
        memory tracker started between steps sees them (gradients are model state)."""
        optimizer.zero_grad(set_to_none=True)
        clock = PhaseClock(self.phase_clock)
        loss = loss_fn(model, inputs)
        clock.mark("forward")
        if self.scaler is None:
            loss.backward()
            clock.mark("backward")
            optimizer.step()
        else:  # fp16: a step with an inf or NaN gradient is skipped and the scale backs off
            self.scaler.scale(loss).backward()
            clock.mark("backward")
            self.scaler.step(optimizer)  # (it has read found_inf: the step is synchronised already)
            scale = self.scaler.get_scale()
            self.scaler.update()
            self.count_step(skipped=self.scaler.get_scale() < scale)
        clock.mark("optimizer")
        return loss.detach()

    def count_step(self, *, skipped: bool) -> None:
        """Count a loss-scaled step as taken or skipped (``skipped_steps``)."""
        self.last_step_skipped = skipped
        self.skipped_steps += skipped

    def loss_scale(self) -> float | None:
        """The loss scaler's current scale; None where the loss is not scaled."""
        return None if self.scaler is None else float(self.scaler.get_scale())

    def observe_memory(self, observer: Callable[[torch.Tensor, str], None] | None) -> None:
        """Install (or remove, with None) a callback that the strategy calls with each tensor it
        allocates during a step and its category, so memory accounting can type it."""

    def teardown(self) -> None:
        """Release anything ``setup`` created beyond the model and optimizer."""

    def memory_tensors(self) -> dict[str, list[torch.Tensor]]:
        """Persistent tensors this strategy holds outside the model's parameters and gradients
        and the optimizer's state, by category ("grads", "optimizer", "comm", "other"), so memory
        accounting types them correctly (e.g. gradient shards, fp32 master weights)."""
        return {}
