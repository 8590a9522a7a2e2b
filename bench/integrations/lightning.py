"""Our ZeRO as a Lightning strategy: ``Trainer(strategy="shardbench_zero2")``.

Importing this module registers ``shardbench_zero1``, ``shardbench_zero2`` and
``shardbench_zero3`` in Lightning's ``StrategyRegistry``; ``ShardbenchStrategy(stage=2, ...)`` is
the same strategy as an instance, with its options::

    import shardbench.integrations.lightning  # noqa: F401  (registers the names)
    trainer = Trainer(strategy="shardbench_zero2", accelerator="gpu", devices=8)

What the strategy does in ``fit`` (one process per device, launched as ``strategy="ddp"`` is):

- every optimizer ``configure_optimizers`` returns is rebuilt as a ``ShardedOptimizer`` of the
  same class, groups and hyperparameters (it must still be stateless), and its LR schedulers are
  pointed at the rebuilt one: they keep setting the learning rate it steps with;
- the LightningModule is wrapped in ``ShardedDataParallel(module, optimizer, stage=...)``, which
  reduces gradients to their owners during backward (``training_step`` runs through the
  wrapper, so stage 3 gathers each unit as it runs);
- ``gradient_clip_val`` clips by the global norm over every rank's shards (or, with
  ``gradient_clip_algorithm="value"``, clamps each shard: elementwise, so exact);
- ``accumulate_grad_batches``: every micro-batch's backward reduces its gradients into the
  shards, which sum across micro-batches. DDP's ``no_sync`` would hold the full local gradients
  instead, the memory ZeRO exists to save;
- checkpoints are consolidated: the full model state dict (stage 3 gathers it unit by unit)
  and the plain optimizer state (``ShardedOptimizer.consolidate_state_dict``), the format
  ``strategy="ddp"`` writes, so either strategy resumes from the other's checkpoint.

``validate``, ``test`` and ``predict`` outside ``fit`` build no optimizer and wrap nothing: the
module runs whole on every rank, as under ``ddp``. At the end of ``fit`` stage 3 gathers the
parameters back into the module, so it can be evaluated, saved or trained again.

Precision: ``"32-true"``, ``"bf16-mixed"`` (parameters, gradients and the shards the optimizer
updates stay fp32; autocast runs the forward in bf16) and ``"bf16-true"`` (bf16 parameters and
gradients; each rank keeps fp32 master weights for its own shard only). ``"16-mixed"`` is fp16
autocast over fp32 parameters, its gradient scaler replaced by ``ShardedGradScaler``
(torch's scaler unscales ``param.grad``, which a sharded gradient leaves empty; ours unscales the
shards and agrees on an overflow across ranks). Lightning runs fp16 AMP only on CUDA: on the CPU
it says so in one line and trains ``"bf16-mixed"`` instead.

Trainability may change between steps, as Lightning's ``BackboneFinetuning`` changes it: a
``requires_grad`` flipped or a param group added (``optimizer.add_param_group``) is laid out at the
next forward (``ShardedDataParallel``), each unchanged parameter keeping its optimizer state.
Stock callbacks that read every parameter's value: ``lightning_callbacks.py``.

While gradients are sharded, ``param.grad`` is None between backward and the optimizer step
(the gradients live in the reducer's buffers): a hook that reads ``param.grad`` there (gradient
norm logging) sees nothing.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Generator, Iterable, Mapping
from typing import Any

import torch
from torch import nn

try:
    import lightning.pytorch as pl
    from lightning.fabric.utilities.exceptions import MisconfigurationException
    from lightning.fabric.utilities.optimizer import _optimizers_to_device
    from lightning.pytorch.core.optimizer import LightningOptimizer
    from lightning.pytorch.overrides.distributed import _sync_module_states
    from lightning.pytorch.plugins.precision import Precision
    from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
    from lightning.pytorch.strategies.strategy import _ForwardRedirection
    from lightning.pytorch.trainer.states import TrainerFn
except ModuleNotFoundError as e:
    if (e.name or "").split(".")[0] != "lightning":
        raise
    raise ModuleNotFoundError(
        "shardbench.integrations.lightning needs Lightning, the 'lightning' extra: "
        "pip install 'shardbench[lightning]'"
    ) from None

from shardbench.blocks import repeated_blocks
from shardbench.integrations.lightning_callbacks import gather_around_hooks, refuse_unsupported
from shardbench.strategies.sharded import (
    ELEMENTWISE_OPTIMIZERS,
    ShardedDataParallel,
    ShardedGradScaler,
    ShardedOptimizer,
)
from shardbench.strategies.sharded.data_parallel import STAGES

#: the ``Trainer(precision=...)`` values the strategy trains with (see the module docstring)
PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "bf16-true")

#: ``unit=``: which modules stage 3 gathers together; a policy, or module classes
UnitSpec = Callable[[nn.Module], bool] | type[nn.Module] | Iterable[type[nn.Module]]


def _unit_policy(unit: UnitSpec | None) -> Callable[[nn.Module], bool] | None:
    if unit is None:
        return None
    if isinstance(unit, type):
        unit = (unit,)
    if not callable(unit):
        classes = tuple(unit)
        if not classes or not all(isinstance(c, type) and issubclass(c, nn.Module) for c in classes):
            raise MisconfigurationException(
                f"ShardbenchStrategy(unit={unit!r}): pass a policy `module -> bool` or nn.Module classes"
            )
        return lambda module: isinstance(module, classes)
    return unit


def _plain(optimizer: Any) -> Any:
    return optimizer._optimizer if isinstance(optimizer, LightningOptimizer) else optimizer


class ShardbenchStrategy(DDPStrategy):
    """Our ZeRO stage ``stage`` (1: optimizer state sharded; 2: gradients too; 3: parameters
    too) in the Trainer; see the module docstring.

    ``bucket_cap_mb``: the size of the flat buckets gradients are reduced in. Stage 3 only:
    ``unit``, the modules gathered together (a policy ``module -> bool`` or nn.Module classes;
    default: every child of an ``nn.ModuleList``/``nn.Sequential`` holding parameters), and
    ``prefetch`` (gather the next unit while one runs). ``assume_elementwise=True`` shards an
    optimizer class outside ``ELEMENTWISE_OPTIMIZERS`` whose update you know to be elementwise.
    ``shard_group_size`` S: hybrid sharding, sharded within groups of S consecutive ranks and
    replicated across them (default: the whole world); S must divide the world size.
    The other keyword arguments are ``DDPStrategy``'s (launch, cluster, process group)."""

    strategy_name = "shardbench"

    def __init__(
        self,
        stage: int = 2,
        *,
        bucket_cap_mb: float = 25.0,
        unit: UnitSpec | None = None,
        prefetch: bool = True,
        assume_elementwise: bool = False,
        shard_group_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        if stage not in STAGES:
            raise MisconfigurationException(
                f"ShardbenchStrategy(stage={stage!r}): the ZeRO stage is one of {', '.join(map(str, STAGES))}"
            )
        if stage != 3 and (unit is not None or prefetch is not True):
            raise MisconfigurationException(
                f"ShardbenchStrategy(stage={stage}): `unit` and `prefetch` are stage 3 options "
                "(only stage 3 shards parameters); pass stage=3"
            )
        if bucket_cap_mb <= 0:
            raise MisconfigurationException(
                f"ShardbenchStrategy(bucket_cap_mb={bucket_cap_mb!r}): must be > 0"
            )
        whole = isinstance(shard_group_size, int) and not isinstance(shard_group_size, bool)
        if shard_group_size is not None and (not whole or shard_group_size < 1):
            raise MisconfigurationException(
                f"ShardbenchStrategy(shard_group_size={shard_group_size!r}): a whole number of ranks "
                "that divides the world size, or None for the whole world"
            )
        self.stage = stage  # (before DDPStrategy's __init__: the precision setter names the strategy)
        super().__init__(**kwargs)
        self.bucket_cap_mb = bucket_cap_mb
        self.unit = _unit_policy(unit)
        self.prefetch = prefetch
        self.assume_elementwise = assume_elementwise
        self.shard_group_size = shard_group_size
        self._forward_redirection = _ForwardRedirection()  # (DDP's touches only DDP wrappers)
        self._wrapper: ShardedDataParallel | None = None
        self._clipping_on: Precision | None = None
        self._failed = False
        self._undo_callbacks: Callable[[], None] | None = None

    @property
    def name(self) -> str:
        """How errors name the strategy: as the Trainer flag spells it."""
        return f"shardbench_zero{self.stage}"

    # ----- precision ---------------------------------------------------------------------------
    @property  # type: ignore[override]
    def precision_plugin(self) -> Precision:
        return DDPStrategy.precision_plugin.fget(self)  # type: ignore[attr-defined]

    @precision_plugin.setter
    def precision_plugin(self, plugin: Precision | None) -> None:
        """Refuses, when the Trainer is built, a precision this strategy cannot train with."""
        precision = getattr(plugin, "precision", None)
        if plugin is not None and precision not in PRECISIONS:
            raise MisconfigurationException(
                f"`Trainer(strategy={self.name!r})` does not support precision {precision!r} "
                f"({type(plugin).__name__}); choose one of {', '.join(PRECISIONS)}"
            )
        stock = getattr(plugin, "scaler", None)
        if stock is not None and not isinstance(stock, ShardedGradScaler):
            plugin.scaler = _sharded_scaler(stock, getattr(plugin, "device", "cuda"))  # type: ignore[union-attr]
        DDPStrategy.precision_plugin.fset(self, plugin)  # type: ignore[attr-defined]

    # ----- setup -------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None and self.model is not None
        self.accelerator.setup(trainer)
        self._failed = False
        fitting = trainer.state.fn == TrainerFn.FITTING
        if fitting and self._layer_sync:
            self.model = self._layer_sync.apply(self.model)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        if fitting:
            if self.stage == 3:
                refuse_unsupported(trainer.callbacks, self.name)
            # the optimizers first: ShardedOptimizer moves the parameters into the flat
            # buckets the wrapper then reduces gradients in
            self.setup_optimizers(trainer)
            self.model = self._setup_model(self.model)
            if self.stage == 3 and self._wrapper is not None:
                summon = self._wrapper.summon_full_params
                self._undo_callbacks = gather_around_hooks(trainer.callbacks, summon)
        else:  # nothing to reduce: the module runs whole on every rank, from rank 0's weights
            _sync_module_states(self.model)
        self._clip_through_optimizer()
        self.setup_precision_plugin()
        if fitting:
            _optimizers_to_device(self.optimizers, self.root_device)

    def setup_optimizers(self, trainer: pl.Trainer) -> None:
        """``configure_optimizers``, then each optimizer rebuilt over its shards and its LR
        schedulers pointed at the rebuilt one."""
        super().setup_optimizers(trainer)
        if len(self.optimizers) != 1:
            raise MisconfigurationException(
                f"`Trainer(strategy={self.name!r})` shards one optimizer; `configure_optimizers` returned "
                f"{len(self.optimizers)}"
            )
        sharded = [self._shard(_plain(opt)) for opt in self.optimizers]
        for old, new in zip(self.optimizers, sharded, strict=True):
            for config in self.lr_scheduler_configs:
                _rebind_scheduler(config.scheduler, _plain(old), new)
        self.optimizers = sharded

    def _shard(self, optimizer: torch.optim.Optimizer) -> ShardedOptimizer:
        if isinstance(optimizer, ShardedOptimizer):
            return optimizer
        cls = type(optimizer)
        if not self.assume_elementwise and not issubclass(cls, ELEMENTWISE_OPTIMIZERS):
            allowed = ", ".join(c.__name__ for c in ELEMENTWISE_OPTIMIZERS)
            raise MisconfigurationException(
                f"`Trainer(strategy={self.name!r})` cannot shard {cls.__name__} exactly: its update may "
                f"need whole-tensor statistics. Allowed: {allowed}; or ShardbenchStrategy("
                "assume_elementwise=True) if every element's update depends on that element alone"
            )
        if optimizer.state:
            raise MisconfigurationException(
                f"`Trainer(strategy={self.name!r})`: the {cls.__name__} from `configure_optimizers` "
                "already has state; the sharded optimizer is built from a fresh one (state is loaded after)"
            )
        return ShardedOptimizer.from_optimizer(
            optimizer, bucket_cap_mb=self.bucket_cap_mb, assume_elementwise=self.assume_elementwise
        )

    def _setup_model(self, model: nn.Module) -> ShardedDataParallel:  # type: ignore[override]
        optimizer = _plain(self.optimizers[0])
        options: dict[str, Any] = {"shard_group_size": self.shard_group_size}
        if self.stage == 3:
            self._check_units(model)
            options |= {"unit": self.unit, "prefetch": self.prefetch}
        self._wrapper = ShardedDataParallel(model, optimizer, stage=self.stage, **options)
        return self._wrapper

    def _check_units(self, model: nn.Module) -> None:
        """Stage 3 with no unit but the root would keep every parameter gathered through the
        whole step: no saving over stage 2, so it is refused."""
        # (frozen blocks count: a fine-tuning callback may unfreeze them, and the units are
        # found again when it does)
        if self.unit is None:
            found = bool(repeated_blocks(model, frozen_too=True))
        else:
            found = any(m is not model and self.unit(m) and any(m.parameters()) for m in model.modules())
        if not found:
            where = (
                "no nn.ModuleList/nn.Sequential child holding parameters"
                if self.unit is None
                else ("no submodule with parameters matches `unit`")
            )
            raise MisconfigurationException(
                f"`Trainer(strategy={self.name!r})` found no units to gather in {type(model).__name__}: "
                f"{where}, so every parameter would stay gathered. Keep your blocks in an nn.ModuleList, "
                "or pass ShardbenchStrategy(stage=3, unit={YourBlock})"
            )

    def configure_ddp(self) -> None:
        """Never a DistributedDataParallel: ``setup`` wraps the module in ours."""

    @contextlib.contextmanager
    def block_backward_sync(self) -> Generator[None, None, None]:
        """Accumulated micro-batches reduce as they go (see the module docstring)."""
        yield None

    # ----- gradient clipping -------------------------------------------------------------------
    def _clip_through_optimizer(self) -> None:
        """Lightning asks the precision plugin, not the strategy, to clip, and the plugin clips
        the ``param.grad`` of the optimizer's parameters, which sharded gradients leave empty:
        on this plugin instance, a sharded optimizer clips its own shards instead."""
        plugin = self.precision_plugin
        by_norm, by_value = plugin.clip_grad_by_norm, plugin.clip_grad_by_value

        def clip_by_norm(optimizer: Any, clip_val: float) -> None:
            opt = _plain(optimizer)
            opt.clip_grad_norm_(clip_val) if isinstance(opt, ShardedOptimizer) else by_norm(
                optimizer, clip_val
            )

        def clip_by_value(optimizer: Any, clip_val: float) -> None:
            opt = _plain(optimizer)
            opt.clip_grad_value_(clip_val) if isinstance(opt, ShardedOptimizer) else by_value(
                optimizer, clip_val
            )

        plugin.clip_grad_by_norm = clip_by_norm  # type: ignore[method-assign]
        plugin.clip_grad_by_value = clip_by_value  # type: ignore[method-assign]
        self._clipping_on = plugin

    def _restore_clipping(self) -> None:
        if self._clipping_on is not None:
            for name in ("clip_grad_by_norm", "clip_grad_by_value"):
                self._clipping_on.__dict__.pop(name, None)
            self._clipping_on = None

    # ----- checkpoints -------------------------------------------------------------------------
    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The full model state (a collective under stage 3: every rank calls it)."""
        if self._wrapper is not None and self.stage == 3:
            return self._wrapper.full_state_dict()
        return super().lightning_module_state_dict()

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        """Loads the full model state. Lightning does this before ``setup`` wraps the module;
        a stage-3 module already wrapped keeps only its shards and cannot take it whole."""
        if self._wrapper is not None and self.stage == 3:
            raise MisconfigurationException(
                f"`{self.name}` cannot load a full model state into a module whose parameters are sharded; "
                "load it before `fit` wraps the module (`trainer.fit(model, ckpt_path=...)`)"
            )
        super().load_model_state_dict(checkpoint, strict=strict)
        for optimizer in self.optimizers:  # bf16-true: fp32 master shards follow the loaded weights
            opt = _plain(optimizer)
            if isinstance(opt, ShardedOptimizer):
                opt.refresh_master_weights()

    # ----- teardown ----------------------------------------------------------------------------
    def on_exception(self, exception: BaseException) -> None:
        """After a failure the ranks may be anywhere: teardown runs no collective."""
        self._failed = True
        super().on_exception(exception)

    def teardown(self) -> None:
        if self._undo_callbacks is not None:
            self._undo_callbacks()
            self._undo_callbacks = None
        if self._wrapper is not None:
            if self.stage == 3 and not self._failed:
                _unshard(self.lightning_module, self._wrapper.full_state_dict())
            self._wrapper.close()
            self._wrapper = None
            self.model = self.lightning_module
        self._restore_clipping()
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        for stage in STAGES:
            name = f"shardbench_zero{stage}"
            if name not in strategy_registry:
                strategy_registry.register(
                    name,
                    cls,
                    description=f"shardbench's ZeRO stage {stage} (ShardedDataParallel)",
                    stage=stage,
                )


def _sharded_scaler(stock: torch.amp.GradScaler, device: str) -> ShardedGradScaler:
    """``ShardedGradScaler`` with the stock scaler's settings and state."""
    scaler = ShardedGradScaler(
        device,
        growth_factor=stock.get_growth_factor(),
        backoff_factor=stock.get_backoff_factor(),
        growth_interval=stock.get_growth_interval(),
        enabled=stock.is_enabled(),
    )
    if stock.is_enabled():
        scaler.load_state_dict(stock.state_dict())
    return scaler


def _unshard(module: nn.Module | None, state: dict[str, torch.Tensor]) -> None:
    """Give every parameter its full value back, in storage of its own (stage 3 left the module's
    parameters as views of flat buffers that hold nothing between uses)."""
    if module is None:
        return
    for name, p in module.named_parameters(remove_duplicate=False):
        if name in state and p.untyped_storage().size() == 0:
            p.data = state[name]


def _rebind_scheduler(scheduler: Any, old: torch.optim.Optimizer, new: torch.optim.Optimizer) -> None:
    """Point ``scheduler`` (and the schedulers it chains) from ``old`` at ``new``."""
    if getattr(scheduler, "optimizer", None) is old:
        scheduler.optimizer = new
        _track_step_calls(new)
    for child in getattr(scheduler, "_schedulers", ()):  # SequentialLR, ChainedScheduler
        _rebind_scheduler(child, old, new)


def _track_step_calls(optimizer: torch.optim.Optimizer) -> None:
    """What an LR scheduler does to the optimizer it is built over: mark each ``step`` call, so
    its check that the optimizer stepped before it did reads the optimizer it now follows."""
    if hasattr(optimizer.step, "_wrapped_by_lr_sched"):
        return
    step = optimizer.step.__func__  # type: ignore[attr-defined]
    ref = weakref.ref(optimizer)  # (the optimizer holds this wrapper: no cycle through it)

    @functools.wraps(step)
    def tracked(*args: Any, **kwargs: Any) -> Any:
        opt = ref()
        opt._opt_called = True  # type: ignore[union-attr]
        return step(opt, *args, **kwargs)

    tracked._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = tracked  # type: ignore[method-assign]


ShardbenchStrategy.register_strategies(StrategyRegistry)

__all__ = ["PRECISIONS", "ShardbenchStrategy"]
