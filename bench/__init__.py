"""shardbench: memory and throughput benchmarks for distributed PyTorch training.

The public API, for your own models and training loops::

    from shardbench import ModelSpec, Input, Workload                # a workload of your own
    from shardbench import ShardedOptimizer, ShardedDataParallel     # our ZeRO, stages 1-3
    from shardbench import ShardedGradScaler                         # fp16 loss scaling for it

Each name is imported on first use, so ``import shardbench`` (and the CLI's commands that never
train: ``list``, ``report``, ``compare``) does not load torch.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it
_PUBLIC = {
    "Input": "shardbench.models.custom",
    "ModelSpec": "shardbench.models.custom",
    "Workload": "shardbench.models.base",
    "ShardedOptimizer": "shardbench.strategies.sharded",
    "ShardedDataParallel": "shardbench.strategies.sharded",
    "ShardedGradScaler": "shardbench.strategies.sharded",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'shardbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
