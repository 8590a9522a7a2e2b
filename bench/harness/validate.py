"""Every input checked in one place, before the first cell starts and before anything is written.

All subcommands (run, max-size, claim, and what later studies add) turn their arguments into
cells and an output directory and pass both through here, so a mistake is refused the same way
everywhere: one ``ValueError`` naming the field, the bad value and what is allowed (the CLI
prints it and exits 2). Planning happens here too, once: the strategy's canonical name and the
world each cell really gets are fixed in the cell, which carries them to every rank.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import uuid
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from shardbench.core_binding import binding_on
from shardbench.harness.config import DEVICES, CellConfig
from shardbench.harness.job import current_job
from shardbench.precision import PRECISIONS
from shardbench.wording import count

#: a fake world is a few tensors per rank-0 partition; past this the partition bookkeeping is
#: the bottleneck and no real job is that wide
MAX_SIMULATED_WORLD = 1 << 16
#: free space an output directory must have: the records (a few KiB a cell) and a report
MIN_FREE_BYTES = 16 << 20


#: the longest timeout a cell takes: a week
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def max_real_ranks() -> int:
    """How many rank processes this host may start for one cell: each is a full Python with
    torch (~0.5-1 GiB), so more than a few per core only thrashes; 64 at most."""
    return min(64, 4 * (os.cpu_count() or 1))


def check_number(
    name: str, value: Any, *, minimum: float, integer: bool = False, above: bool = False
) -> None:
    """``value`` is a finite number >= ``minimum`` (> with ``above``), an integer if asked, and
    never a boolean (``True`` is not 1 here)."""
    kind = "an integer" if integer else "a number"
    bound = f"{'>' if above else '>='} {minimum:g}"
    ok_type = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok_type or not math.isfinite(value):
        raise ValueError(f"{name} must be {kind} {bound}, got {value!r}")
    if value < minimum or (above and value == minimum):
        raise ValueError(f"{name} must be {bound}, got {value!r}")


def check_world_size(n: Any, *, simulate: bool) -> None:
    check_number("world size", n, minimum=1, integer=True)
    if simulate and n > MAX_SIMULATED_WORLD:
        raise ValueError(
            f"world size {n} is more than a simulated world can be (at most {MAX_SIMULATED_WORLD})"
        )
    job = current_job()
    if not simulate and job is not None and n > job.world_size:
        raise ValueError(
            f"world size {n} needs {n} rank processes; this {job.describe()} has {job.world_size}; "
            "start a larger job, or use --simulate or --fake (one process plays rank 0 of the world)"
        )
    limit = max_real_ranks()
    if not simulate and job is None and n > limit:
        raise ValueError(
            f"world size {n} needs {n} rank processes; this host runs at most {limit} "
            f"({count(os.cpu_count() or 1, 'core')} x 4, capped at 64); for larger N use --simulate or "
            "--fake (one process plays rank 0 of the world)"
        )


def check_timeout(seconds: Any) -> None:
    """A cell's timeout: a number of seconds above 0 and at most a week (a longer one overflows
    the waits it bounds)."""
    check_number("timeout (seconds)", seconds, minimum=0, above=True)
    if seconds > MAX_TIMEOUT_S:
        week = f"{MAX_TIMEOUT_S:g} (a week)"
        raise ValueError(f"timeout (seconds) must be at most {week}, got {seconds:g}")


def plan_cells(cells: Iterable[CellConfig]) -> list[CellConfig]:
    """Validate each cell and fix its plan: canonical strategy name, workload and preset known,
    numbers in range, the shard width fitted (``shard_width``: a line on stderr for each kind of
    cell it leaves out), and the world the strategy really gets on this device (``ValueError``
    otherwise). Returns the planned cells in order."""
    from shardbench.harness.bounded import check_workload
    from shardbench.harness.shard_width import fit_shard_groups
    from shardbench.metrics.topology import check_ranks_per_node
    from shardbench.models.registry import get_workload
    from shardbench.strategies.registry import canonical_name, check_runnable, get_strategy

    binding_on()  # a bad SHARDBENCH_BIND_CORES is refused before any cell, not in a rank
    cells, left_out = fit_shard_groups(cells)
    for line in left_out:
        print(f"shardbench: {line}", file=sys.stderr)
    planned: list[CellConfig] = []
    for cell in cells:
        if cell.device not in DEVICES:
            raise ValueError(f"unknown device {cell.device!r}; allowed: {', '.join(DEVICES)}")
        if cell.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {cell.precision!r}; allowed: {', '.join(PRECISIONS)}")
        check_world_size(cell.world_size, simulate=cell.simulate or cell.fake)
        per_node = cell.ranks_per_node
        if per_node is not None and not (isinstance(per_node, int) and per_node >= cell.world_size):
            check_ranks_per_node(per_node, cell.world_size)  # a world past one node: full nodes
        check_number("batch size", cell.batch_size, minimum=1, integer=True)
        check_number("steps", cell.steps, minimum=1, integer=True)
        check_number("warmup", cell.warmup, minimum=0, integer=True)
        check_timeout(cell.timeout_s)
        if cell.memory_budget_bytes is not None:
            check_number("memory budget (bytes)", cell.memory_budget_bytes, minimum=1, integer=True)
        # a workload of one's own runs its code in a child first, bounded by the timeout
        check_workload(
            cell.workload,
            cell.preset,
            timeout_s=cell.timeout_s,
            fake=cell.fake,
            checkpointing=cell.activation_checkpointing,
        )
        workload = get_workload(cell.workload)
        workload.check_preset(cell.preset)
        if cell.fake:
            workload.check_plannable()
        if cell.activation_checkpointing:
            workload.check_checkpointable()
        name = canonical_name(cell.strategy)
        check_runnable(name, cell.device, cell.precision)
        # inside a torchrun or Slurm job a cell's ranks are the job's processes, each with its
        # own device, on any of its nodes: the job's size bounds a world, not this host's devices
        job = current_job()
        plan = get_strategy(name).plan_world(
            cell.world_size,
            cell.device,
            cell.simulate or cell.fake,
            devices=job.world_size if job is not None else None,
        )
        planned.append(replace(cell, strategy=name, simulate=cell.simulate or cell.fake, plan=plan))
    return planned


def check_output_dir(path: Path, *, cells: int = 1) -> None:
    """``path`` can hold a run: it is (or can be made) a directory, a probe file can be written
    and removed there, and the disk has room for the records and a report."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {path} exists and is not a directory; give a directory (new or existing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".shardbench-probe-{uuid.uuid4().hex}"
        probe.write_bytes(b"probe\n")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"--out {path} is not writable: {e.strerror or e}") from None
    free = shutil.disk_usage(path).free
    need = MIN_FREE_BYTES + cells * (64 << 10)
    if free < need:
        raise ValueError(
            f"--out {path}: only {free / 2**20:.1f} MiB free, a run needs at least {need / 2**20:.0f} MiB"
        )
