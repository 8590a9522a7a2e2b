"""What a command builds at the first use of a peer, said before the cell that waits for it: on
the CPU, DeepSpeed compiles its shared-memory communication op the first time a DeepSpeed
process starts (a minute or more on a small machine), and a cell silent for that long reads as
a hang. Once built, torch keeps the op in its extensions folder and nothing is said."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterable
from pathlib import Path

#: the name DeepSpeed builds its CPU shared-memory op under (its ShareMemCommBuilder's NAME)
DEEPSPEED_CPU_OP = "deepspeed_shm_comm"


def extensions_dir() -> Path | None:
    """Where torch keeps the ops it builds just in time: ``$TORCH_EXTENSIONS_DIR``, else its
    default root's folder for this Python and this torch build (torch.utils.cpp_extension's
    rule, which names the folder after the build's CUDA or ROCm version, or cpu). Read without
    importing cpp_extension, which warns on a machine without a CUDA runtime; None where torch
    has no ``_appdirs`` to find its default root with."""
    if root := os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(root)
    import torch

    try:
        from torch import _appdirs as appdirs
    except ImportError:
        return None
    if torch.version.hip is not None:
        build = "rocm" + torch.version.hip.replace(".", "")
    elif torch.version.cuda is not None:
        build = "cu" + torch.version.cuda.replace(".", "")
    else:
        build = "cpu"
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return Path(os.path.realpath(appdirs.user_cache_dir(appname="torch_extensions"))) / f"{python}_{build}"


def deepspeed_op_folder() -> Path | None:
    """The folder DeepSpeed's CPU op is built into, None where it cannot be told."""
    root = extensions_dir()
    return None if root is None else root / DEEPSPEED_CPU_OP


def deepspeed_build_note(strategies: Iterable[str], device: str) -> str | None:
    """One line where DeepSpeed cells about to run on the CPU will build its op first, else
    None (no DeepSpeed cell, a CUDA device, DeepSpeed not installed, the op already built or
    its folder unknown)."""
    if device != "cpu" or not any(s.startswith("deepspeed-") for s in strategies):
        return None
    folder = deepspeed_op_folder()
    if folder is None or (folder / f"{DEEPSPEED_CPU_OP}.so").is_file():
        return None
    if importlib.util.find_spec("deepspeed") is None:
        return None
    return (
        "deepspeed: its CPU communication op is compiled before the first DeepSpeed cell (once, a "
        f"minute or more; kept in {folder}), so that cell starts slowly"
    )
