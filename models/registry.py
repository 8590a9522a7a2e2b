"""Workloads by name. An unknown name raises ``ValueError`` listing the valid ones."""

from __future__ import annotations

from models.base import Workload
from models.deepspeech2 import DeepSpeech2Workload
from models.imagegpt import ImageGPTWorkload
from models.swav import SwAVWorkload
from models.transformer import TransformerWorkload

_WORKLOADS: dict[str, type[Workload]] = {
    cls.name: cls for cls in (TransformerWorkload, ImageGPTWorkload, SwAVWorkload, DeepSpeech2Workload)
}


def workload_names() -> list[str]:
    return list(_WORKLOADS)


def get_workload(name: str) -> Workload:
    try:
        return _WORKLOADS[name]()
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; allowed: {', '.join(_WORKLOADS)}") from None
