"""Workloads by name. An unknown name raises ``ValueError`` listing the valid ones.

Each workload's module is imported only when that workload is asked for: transformers,
torchvision and torchaudio take seconds to import, and a process that runs one workload (a
benchmark rank, a test) should pay only for that one. A workload with a module in
``models/presets/`` has its parameter counts there, importing no torch: ``preset_param_counts``
reads only that module, so ``shardbench list`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardbench.models.base import Workload

# name -> "module:class", in the order ``workload_names()`` lists them
_WORKLOADS: dict[str, str] = {
    "transformer": "shardbench.models.transformer:TransformerWorkload",
    "imagegpt": "shardbench.models.imagegpt:ImageGPTWorkload",
    "swav": "shardbench.models.swav:SwAVWorkload",
    "deepspeech2": "shardbench.models.deepspeech2:DeepSpeech2Workload",
}

# name -> its torch-free presets module (PRESETS, LADDER, param_count), for the workloads that
# have one; any other workload's counts come from its class (an import, a meta build)
_PRESET_MODULES: dict[str, str] = {
    "transformer": "shardbench.models.presets.transformer",
    "imagegpt": "shardbench.models.presets.imagegpt",
    "swav": "shardbench.models.presets.swav",
    "deepspeech2": "shardbench.models.presets.deepspeech2",
}


def workload_names() -> list[str]:
    """The built-in workloads, then those installed packages register (``models/specs.py``)."""
    from shardbench.models.specs import registered

    return [*_WORKLOADS, *(n for n in registered() if n not in _WORKLOADS)]


def workload_class(name: str) -> type[Workload]:
    """A built-in workload's class."""
    try:
        module, cls = _WORKLOADS[name].split(":")
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; allowed: {', '.join(_WORKLOADS)}") from None
    return getattr(importlib.import_module(module), cls)


def get_workload(name: str) -> Workload:
    """The workload ``name`` names: a built-in one, or any spec ``models/specs.py`` resolves
    (``hf:Arch``, ``module:factory``, ``file.py:factory``, a registered entry point)."""
    if name in _WORKLOADS:
        return workload_class(name)()
    from shardbench.models.specs import FORMS, is_spec, resolve

    if is_spec(name):
        return resolve(name)
    raise ValueError(f"unknown workload {name!r}; allowed: {', '.join(workload_names())}, or {FORMS}")


def preset_param_counts(name: str) -> dict[str, int]:
    """{preset: parameter count} in preset order, importing only the workload's presets module
    (no torch) where it has one; otherwise the workload class's ``param_count`` (a meta build)."""
    if name in _PRESET_MODULES:
        presets = importlib.import_module(_PRESET_MODULES[name])
        return {p: presets.param_count(shape) for p, shape in presets.PRESETS.items()}
    w = get_workload(name)  # raises the ValueError naming the known workloads
    return {p: w.param_count(p) for p in w.presets}


def size_family_help(name: str) -> str | None:
    """How to spell any size of the workload's family (torch-free where it has a presets
    module), or None when it has none."""
    if name in _PRESET_MODULES:
        family = getattr(importlib.import_module(_PRESET_MODULES[name]), "FAMILY", None)
    else:
        family = get_workload(name).size_family()
    return family.help() if family is not None else None
