"""What a rank counts for its cell's throughput figures: the FLOPs of one step of its batch
(``bench/prediction/flops.py``), and on CUDA the device's peak (a table, or a probe on the device
for one it lacks; a CPU's peak is resolved by whoever assembles the record, once the ranks have
finished and the cores are free, see ``harness.result``).

Counting runs once per cell on rank 0, on the model as built, before the strategy wraps it
(every rank's micro-batch is the same shape, and counting on the unwrapped model runs no
collective). The counts are held by a ``StepCounts`` that whoever runs the cells owns, keyed by
everything a count depends on. A command runs each cell in fresh rank processes, so the
launcher hands rank 0 what earlier cells of the same run counted (``HANDED``, beside the cell's
result files) and takes back what it counted anew (``COUNTED``): a suite's cells that differ
only in strategy or world size count once. Only within one run: a model's code may change
between two, and two owners never share their counts.
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
from shardbench.prediction.flops import StepFlops, count_step, matmul_dtype
from shardbench.prediction.op_calls import CallsJson, OpCall, calls_from_json, calls_to_json
from shardbench.prediction.peaks import datasheet_peak, measured_peak
from shardbench.step_figures import FlopsPerStep

#: a step's count and, beside it, the calls the count recorded (on a CPU)
Counted = tuple[StepFlops, tuple[OpCall, ...] | None]
#: in a cell's result folder: the counts the launcher hands its rank 0, and those rank 0 made
HANDED, COUNTED = "counts-handed.json", "counts-counted.json"


class StepCounts:
    """The step counts one owner (a run's launcher, a rank process) made or was handed."""

    def __init__(self) -> None:
        self._counted: dict[tuple[Any, ...], Counted] = {}
        #: the keys this owner counted itself (the others were handed to it)
        self._own: set[tuple[Any, ...]] = set()

    def get(self, key: tuple[Any, ...]) -> Counted | None:
        return self._counted.get(key)

    def add(self, key: tuple[Any, ...], counted: Counted) -> None:
        """A count this owner made."""
        self._counted[key] = counted
        self._own.add(key)

    def keys(self) -> list[tuple[Any, ...]]:
        return list(self._counted)

    def adopt(self, path: Path) -> None:
        """Take the counts in ``path`` (``export``'s file), where it exists and reads whole. A
        file that does not (its writer killed) hands nothing: the next cell counts again."""
        try:
            entries = json.loads(path.read_text())
            adopted = {tuple(key): _from_json(flops, calls) for key, flops, calls in entries}
        except (OSError, ValueError, TypeError, KeyError):  # absent, or not whole
            return
        for key, counted in adopted.items():
            self._counted.setdefault(key, counted)

    def export(self, path: Path, *, own_only: bool = False, cell: CellConfig | None = None) -> None:
        """Write the counts to ``path``, whole or not at all: those this owner made itself
        (``own_only``), or those of ``cell``'s step (``_step_of``), the only ones its rank 0
        reads."""
        keys = list(self._own if own_only else self._counted)
        if cell is not None:
            step = _step_of(cell)
            keys = [k for k in keys if k[: len(step)] == step]
        if keys:
            atomic_write_text(path, json.dumps([[list(k), *_to_json(self._counted[k])] for k in keys]))


def _to_json(counted: Counted) -> list[Any]:
    flops, calls = counted
    return [flops.to_json(), calls_to_json(calls) if calls is not None else None]


def _from_json(flops: dict[str, Any], calls: CallsJson | None) -> Counted:
    return StepFlops.from_json(flops), calls_from_json(calls) if calls is not None else None


def _step_of(cell: CellConfig) -> tuple[Any, ...]:
    """The leading fields of the keys (``cell_flops``) of ``cell``'s step."""
    return (cell.workload, cell.preset, cell.batch_size, cell.seed)


def cell_flops(
    cell: CellConfig,
    workload: Any,
    model: nn.Module,
    device: torch.device,
    data_rank: int,
    counts: StepCounts,
) -> tuple[FlopsPerStep | None, str | None, tuple[OpCall, ...] | None]:
    """The record's ``flops_per_step`` for ``data_rank``'s batch of the cell, or None and why
    not (a count that fails costs the cell its FLOPs, never its measurement); and the counted
    pass's operator calls, which the launcher replays for the step's compute time
    (``bench/prediction/op_replay.py``). ``counts``: the counts made so far, and where this one
    goes."""
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
        counted = counts.get(key)
        if counted is None:
            counted = _count(cell, workload, model, device, data_rank, tensors)
            counts.add(key, counted)
        tokens = workload.tokens_per_sample(cell.preset)
    except Exception as e:  # noqa: BLE001 - an uncountable op must not fail the measurement
        text = str(e).strip().splitlines()
        return None, f"FLOPs not counted ({type(e).__name__}: {text[0][:160] if text else ''})", None
    flops, calls = counted
    dtype = matmul_dtype(cell.precision, device.type)
    return flops.to_record(cell.batch_size, tokens, dtype, time.perf_counter() - started), None, calls


def _count(
    cell: CellConfig, workload: Any, model: nn.Module, device: torch.device, data_rank: int, tensors: str
) -> Counted:
    """One count of the cell's step; on a CPU with its calls beside it (the step-time model
    replays a CPU step only)."""

    def batch() -> Any:
        return workload.batch(
            cell.preset, cell.batch_size, seed=cell.seed, step=0, rank=data_rank, device=device
        )

    return count_step(
        model,
        workload.loss,
        batch,
        device=device,
        tensors=tensors,
        autocast=compute_dtype(cell.precision),
        record_calls=device.type == "cpu",
    )


def cuda_peak(dtype: str) -> dict[str, Any]:
    """The peak of this process's CUDA device at ``dtype``: its datasheet's, or measured on it
    (and cached) when the table lacks it."""
    name = torch.cuda.get_device_name()
    return datasheet_peak(name, dtype) or measured_peak(
        "cuda", name, dtype, None, torch_version=torch.__version__
    )
