"""Lightning's stock callbacks under ``shardbench_zero3``, whose parameters are sharded between
steps (stages 1 and 2 keep every parameter whole: callbacks see what they see under ``ddp``).

- ``StochasticWeightAveraging`` reads every parameter at the start of each SWA epoch (to average
  it) and writes them at the end (the average): around those two hooks every unit is gathered
  (``ShardedDataParallel.summon_full_params``, a collective: Lightning calls callback hooks on
  every rank), so each rank briefly holds the whole parameters, as its averaged copy already does.
- ``WeightAveraging`` (EMA) reads every parameter after every batch: gathering the whole model
  at each step would undo what stage 3 saves, so it is refused, in one line, at ``fit``.

The others of the stock set (``BackboneFinetuning``, ``ModelCheckpoint``, ``LearningRateMonitor``,
``GradientAccumulationScheduler``, ``EarlyStopping``) read no parameter value and need nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import Callback, StochasticWeightAveraging

try:  # (Lightning >= 2.5)
    from lightning.pytorch.callbacks import WeightAveraging
except ImportError:  # pragma: no cover - older Lightning has no such callback
    WeightAveraging = None

#: the hooks of a callback that reads or writes every parameter's value, per callback class
WHOLE_DURING: dict[type[Callback], tuple[str, ...]] = {
    StochasticWeightAveraging: ("on_train_epoch_start", "on_train_end"),
}


def refuse_unsupported(callbacks: list[Callback], strategy_name: str) -> None:
    """One line at ``fit`` for a callback that cannot run under stage 3."""
    for cb in callbacks:
        if WeightAveraging is not None and isinstance(cb, WeightAveraging):
            if isinstance(cb, StochasticWeightAveraging):
                continue
            raise MisconfigurationException(
                f"`Trainer(strategy={strategy_name!r})` cannot run {type(cb).__name__}: it reads every "
                "parameter after every batch, and gathering the whole model each step undoes what "
                "stage 3 saves; use shardbench_zero2, or StochasticWeightAveraging (per epoch)"
            )


def gather_around_hooks(callbacks: list[Callback], summon: Callable[[], Any]) -> Callable[[], None]:
    """Run the parameter-reading hooks of ``callbacks`` (``WHOLE_DURING``) inside ``summon()``;
    returns what undoes it."""
    patched: list[tuple[Callback, str]] = []
    for cb in callbacks:
        hooks = next((h for cls, h in WHOLE_DURING.items() if isinstance(cb, cls)), ())
        for name in hooks:
            original = getattr(cb, name)

            @functools.wraps(original)
            def whole(*args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
                with summon():
                    return _original(*args, **kwargs)

            setattr(cb, name, whole)  # Lightning looks the hook up on the instance
            patched.append((cb, name))

    def undo() -> None:
        for cb, name in patched:
            cb.__dict__.pop(name, None)

    return undo
