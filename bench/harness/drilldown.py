"""Drill-down artefacts of one cell (``run --memory-snapshot``, ``run --trace``): PyTorch's own
tools, so a reader can go from our numbers to where the memory and the time went.

* ``--memory-snapshot``: on CUDA with real tensors, the allocator's history over the tracked
  steps (``torch.cuda.memory._record_memory_history`` / ``_dump_snapshot``: a pickle that
  https://pytorch.org/memory_viz opens); elsewhere (CPU, ``--fake``) the memory tracker's own
  per-module table (``MemTracker.display_modulewise_snapshots``: each module's memory by
  category before and after its forward and backward, and its peak).
* ``--trace``: a ``torch.profiler`` Chrome trace of one extra step after the measured ones (the
  measured steps stay unprofiled), with our ``record_function`` phases (``shardbench::...``).

Each rank writes its own files into the cell's directory; both CUDA calls are private APIs,
guarded with a clear error.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from shardbench.harness.config import CellConfig


def _dir(cell: CellConfig) -> Path:
    assert cell.drill_down_dir is not None, "a drill-down cell has its directory set by the run"
    path = Path(cell.drill_down_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path


def uses_allocator_history(cell: CellConfig, device: torch.device) -> bool:
    return cell.memory_snapshot and device.type == "cuda" and not cell.fake


@contextlib.contextmanager
def allocator_history(
    cell: CellConfig, device: torch.device, rank: int, out: dict[str, str]
) -> Iterator[None]:
    """Record the CUDA allocator's history inside the block and dump it after (a no-op unless
    ``uses_allocator_history``)."""
    if not uses_allocator_history(cell, device):
        yield
        return
    memory = torch.cuda.memory
    record, dump = getattr(memory, "_record_memory_history", None), getattr(memory, "_dump_snapshot", None)
    if record is None or dump is None:
        raise RuntimeError(
            f"--memory-snapshot: torch {torch.__version__} lacks torch.cuda.memory._record_memory_history "
            "or _dump_snapshot (private APIs, torch >= 2.1)"
        )
    record(max_entries=200_000)
    try:
        yield
    finally:
        path = _dir(cell) / f"memory-snapshot-rank{rank}.pickle"
        dump(str(path))
        record(enabled=None)
        out[f"memory snapshot (rank {rank})"] = str(path)


def write_module_table(cell: CellConfig, tracker: Any, rank: int, out: dict[str, str]) -> None:
    """The memory tracker's per-module table (the CPU and ``--fake`` memory snapshot)."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        tracker.display_modulewise_snapshots(depth=4, units="MiB", tabulate=False)
    path = _dir(cell) / f"memory-modules-rank{rank}.txt"
    path.write_text(buffer.getvalue())
    out[f"memory by module (rank {rank})"] = str(path)


def trace_one_step(
    cell: CellConfig, device: torch.device, rank: int, step: Callable[[], Any], out: dict[str, str]
) -> dict[str, float] | None:
    """Run ``step`` once under ``torch.profiler`` and export its Chrome trace; on CUDA, return
    how much of its NCCL kernels' time compute kernels hid (``bench/metrics/kernel_overlap.py``)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    path = _dir(cell) / f"trace-rank{rank}.json"
    prof.export_chrome_trace(str(path))
    out[f"trace (rank {rank})"] = str(path)
    if device.type != "cuda":
        return None
    import json

    from shardbench.metrics.kernel_overlap import trace_overlap

    return trace_overlap(json.loads(path.read_text()))
