"""What a rank counts for its cell's throughput figures: the FLOPs of one step of its batch
(``bench/prediction/flops.py``), and on CUDA the device's peak (a table, or a probe on the device
for one it lacks; a CPU's peak is resolved by whoever assembles the record, once the ranks have
finished and the cores are free, see ``harness.result``).

Counting runs once per cell on rank 0, on the model as built, before the strategy wraps it
(every rank's micro-batch is the same shape, and counting on the unwrapped model runs no
collective). A count is kept for the life of the process, keyed by everything it depends on:
a process that runs many cells (the tests' shared worlds) counts each shape once. A command
runs each cell in fresh rank processes, so the launcher hands rank 0 what earlier cells of the
same command counted (``HANDED``, beside the cell's result files) and takes back what it counted
anew (``COUNTED``): a suite's cells that differ only in strategy or world size count once. Only
within one command: a model's code may change between two.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shardbench.harness.config import CellConfig
from shardbench.paths import atomic_write_text
from shardbench.precision import compute_dtype
from shardbench.prediction.flops import StepFlops, count_step_flops, matmul_dtype
from shardbench.prediction.peaks import datasheet_peak, measured_peak

_COUNTED: dict[tuple[Any, ...], StepFlops] = {}
#: the keys this process counted itself (the others were handed to it)
_OWN: set[tuple[Any, ...]] = set()
#: in a cell's result folder: the counts the launcher hands its rank 0, and those rank 0 made
HANDED, COUNTED = "counts-handed.json", "counts-counted.json"


def forget_counts() -> None:
    """Start a new command: no count made for an earlier one is handed on (its model's code
    may have changed since)."""
    _COUNTED.clear()
    _OWN.clear()


def adopt_counts(path: Path) -> None:
    """Take the counts in ``path`` (``export_counts``'s file), where it exists and reads whole.
    A file that does not (its writer killed) hands nothing: the next cell counts again."""
    try:
        entries = json.loads(path.read_text())
        adopted = {tuple(key): StepFlops.from_json(counted) for key, counted in entries}
    except (OSError, ValueError, TypeError, KeyError):  # absent, or not whole
        return
    for key, counted in adopted.items():
        _COUNTED.setdefault(key, counted)


def export_counts(path: Path, *, own_only: bool = False, cell: CellConfig | None = None) -> None:
    """Write this process's counts to ``path``, whole or not at all: those it made itself
    (``own_only``), or those of ``cell``'s step (``_step_of``), the only ones its rank 0 reads."""
    keys = [k for k in (_OWN if own_only else _COUNTED) if k in _COUNTED]
    if cell is not None:
        step = _step_of(cell)
        keys = [k for k in keys if k[: len(step)] == step]
    if keys:
        atomic_write_text(path, json.dumps([[list(k), _COUNTED[k].to_json()] for k in keys]))


def _step_of(cell: CellConfig) -> tuple[Any, ...]:
    """The leading fields of the keys (``cell_flops``) of ``cell``'s step."""
    return (cell.workload, cell.preset, cell.batch_size, cell.seed)


def cell_flops(
    cell: CellConfig, workload: Any, model: nn.Module, device: torch.device, data_rank: int
) -> tuple[dict[str, Any] | None, str | None, list[list[Any]] | None]:
    """The record's ``flops_per_step`` for ``data_rank``'s batch of the cell, or None and why
    not (a count that fails costs the cell its FLOPs, never its measurement); and the counted
    pass's operator calls, which the launcher replays for the step's compute time
    (``bench/prediction/op_replay.py``)."""
    tensors = "active" if cell.fake else "real" if workload.not_plannable else "fake"
    key = (
        *_step_of(cell),
        data_rank,
        cell.activation_checkpointing,
        cell.precision,
        cell.dropout,
        cell.device,  # a CUDA cell planned on the CPU counts the CUDA kernels' FLOPs
        device.type,
        tensors,
    )
    started = time.perf_counter()
    try:
        counted = _COUNTED.get(key)
        if counted is None:
            counted = count_step_flops(
                model,
                workload.loss,
                lambda: workload.batch(
                    cell.preset, cell.batch_size, seed=cell.seed, step=0, rank=data_rank, device=device
                ),
                device=device,
                tensors=tensors,
                autocast=compute_dtype(cell.precision),
                trace=device.type == "cpu",  # the step-time model replays a CPU step only
            )
            _COUNTED[key] = counted
            _OWN.add(key)
        tokens = workload.tokens_per_sample(cell.preset)
    except Exception as e:  # noqa: BLE001 - an uncountable op must not fail the measurement
        text = str(e).strip().splitlines()
        return None, f"FLOPs not counted ({type(e).__name__}: {text[0][:160] if text else ''})", None
    out = counted.to_record(cell.batch_size, tokens, matmul_dtype(cell.precision, device.type))
    out["count_s"] = time.perf_counter() - started
    return out, None, counted.trace


def cuda_peak(dtype: str) -> dict[str, Any]:
    """The peak of this process's CUDA device at ``dtype``: its datasheet's, or measured on it
    (and cached) when the table lacks it."""
    name = torch.cuda.get_device_name()
    return datasheet_peak(name, dtype) or measured_peak(
        "cuda", name, dtype, None, torch_version=torch.__version__
    )
