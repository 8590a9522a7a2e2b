"""Workloads by name. An unknown name raises ``ValueError`` listing the valid ones.

Each workload's module is imported only when that workload is asked for: transformers,
torchvision and torchaudio take seconds to import, and a process that runs one workload (a
benchmark rank, a test) should pay only for that one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from models.base import Workload

# name -> "module:class", in the order ``workload_names()`` lists them
_WORKLOADS: dict[str, str] = {
    "transformer": "models.transformer:TransformerWorkload",
    "imagegpt": "models.imagegpt:ImageGPTWorkload",
    "swav": "models.swav:SwAVWorkload",
    "deepspeech2": "models.deepspeech2:DeepSpeech2Workload",
}


def workload_names() -> list[str]:
    return list(_WORKLOADS)


def workload_class(name: str) -> type[Workload]:
    try:
        module, cls = _WORKLOADS[name].split(":")
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; allowed: {', '.join(_WORKLOADS)}") from None
    return getattr(importlib.import_module(module), cls)


def get_workload(name: str) -> Workload:
    return workload_class(name)()
