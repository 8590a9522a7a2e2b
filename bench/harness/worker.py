"""What one rank does for one cell: build the workload, wrap it with the strategy, warm up,
time the steps, then measure memory by category over a few more steps.

The phases (timing, then memory by category, then an optional profiled step) are
``phases.py``. Run directly by ``shardbench.harness.launch``
(one process per rank, result written to a file) or by torchrun for multi-node runs::

    torchrun --nnodes 2 --nproc-per-node 8 ... -m shardbench.harness.worker \
        --cell cell.json --out results/runs/x

Under torchrun, rank 0 gathers every rank's result and appends the record to ``--out``.

A step whose loss is not finite ends the cell as ``diverged`` (the step is recorded): numbers
measured after a divergence would describe a different computation. ``SHARDBENCH_FAULT`` injects
failures for tests (bench/harness/faults.py).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import functools
import json
import os
import signal
import sys
import time
import traceback

if __name__ == "__main__":  # first, before torch's slow import: the launcher may ask at any time
    faulthandler.register(signal.SIGUSR1, all_threads=True)

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from shardbench.core_binding import (
    RANK_CORES,
    as_variable,
    bind_from_environment,
    leave_comm_threads_free,
    own_cpus,
    unrestricted_cores_of,
)
from shardbench.harness.config import CellConfig, available_cores, threads_per_rank
from shardbench.harness.counting import COUNTED, HANDED, StepCounts, cell_flops, cuda_peak
from shardbench.harness.faults import Fault, faults_from_env
from shardbench.harness.guardian import guard_launcher_child
from shardbench.harness.job import STORE_PREFIX, env_int, job_ranks_per_node, master_port
from shardbench.harness.nvml_check import drop_where_nvml_cannot_answer
from shardbench.harness.phases import (
    CellSteps,
    Diverged,
    Memory,
    StepFailed,
    measure_memory,
    time_steps,
    trace_step,
)
from shardbench.harness.resolved_cell import ResolvedCell
from shardbench.harness.result import RankResult
from shardbench.metrics.kernels import CudaAttention, pinned_factory
from shardbench.metrics.optimizer_tensors import stepped_dtensor_shapes, stepped_elements, stepped_tensors
from shardbench.models.base import concat_inputs
from shardbench.models.checkpointing import apply_activation_checkpointing
from shardbench.prediction.zero_accounting import comm_shape_of
from shardbench.step_figures import FlopsPerStep
from shardbench.strategies.base import RankContext

COLLECTIVE_TIMEOUT_MARGIN_S = 30.0


def init_fake_world(world_size: int) -> None:
    """Join PyTorch's fake process group as rank 0 of ``world_size``: collectives return at once
    and move no data, so one process measures a rank's real memory at any N."""
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as e:
        raise RuntimeError(
            f"torch {torch.__version__} has no fake process group "
            "(torch.testing._internal.distributed.fake_pg); --simulate needs it"
        ) from e
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)


def fake_tensor_mode() -> Any:
    """PyTorch's FakeTensorMode: tensors with shapes, dtypes and storage sizes but no data, so a
    memory tracker sees every allocation while nothing is allocated (``--fake`` planning)."""
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
    except ImportError as e:
        raise RuntimeError(
            f"torch {torch.__version__} has no torch._subclasses.fake_tensor.FakeTensorMode; --fake needs it"
        ) from e
    return FakeTensorMode()


def planned_off_device(cell: CellConfig) -> bool:
    """A fake (planned) cell for CUDA on a machine without it: planned on the CPU, with the
    kernels CUDA would run (``bench/metrics/kernels.py``); nothing of it needs the device."""
    return cell.device == "cuda" and cell.fake and not torch.cuda.is_available()


def _job_store(timeout: timedelta) -> dict[str, Any]:
    """Inside a torchrun or Slurm job, the cell's ranks meet in their own key prefix of the
    job's store (``STORE_PREFIX``, set by ``job_cells.py``), a fresh one per cell; elsewhere they
    meet the usual way, at MASTER_ADDR:MASTER_PORT (no arguments)."""
    prefix = os.environ.get(STORE_PREFIX)
    if not prefix:
        return {}
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], master_port(os.environ), is_master=False, timeout=timeout
    )
    return {"store": dist.PrefixStore(prefix, store)}


def _is_oom(exc: BaseException) -> bool:
    """Out of memory on the device, or an allocation the OS refused on the CPU (torch's
    DefaultCPUAllocator: "can't allocate memory ... Error code 12 (Cannot allocate memory)")."""
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text or "cannot allocate memory" in text


def _rank_device(cell: CellConfig, local_rank: int) -> torch.device:
    """The device this rank computes on; on CUDA its memory capped where the cell emulates a
    smaller card (a real OOM past the budget)."""
    if cell.device != "cuda" or planned_off_device(cell):
        return torch.device("cpu")
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    if cell.memory_budget_bytes is not None:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cell.memory_budget_bytes / total), device)
    return device


def _process_group(
    cell: CellConfig, strategy: Any, device: torch.device, *, rank: int, processes: int, world_size: int
) -> Any:
    """The rank's process group: a simulated world's fake one, the real one a strategy that
    communicates needs, else None."""
    if cell.simulate:
        init_fake_world(world_size)
        return dist.group.WORLD
    if not strategy.needs_process_group:
        return None
    if not dist.is_initialized():
        # past the launcher's deadline, which comes first and says where each rank is stuck;
        # under torchrun (no launcher) this bounds a hang
        timeout = timedelta(seconds=cell.timeout_s + COLLECTIVE_TIMEOUT_MARGIN_S)
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            rank=rank,
            world_size=processes,
            timeout=timeout,
            **_job_store(timeout),
            **({"device_id": device} if device.type == "cuda" else {}),
        )
    return dist.group.WORLD


def run_rank(
    cell: CellConfig | ResolvedCell,
    *,
    rank: int,
    world_size: int,
    processes: int,
    local_rank: int,
    local_world_size: int,
    fault: Fault | None = None,
    counts: StepCounts | None = None,
) -> RankResult:
    """Run one cell on this rank; return its measurements (raises on failure). ``counts``: the
    step counts earlier cells made, which rank 0 adds its own to (default: none)."""
    started = time.perf_counter()  # setup: the strategy's imports and set-up, the model's build
    # a simulated rank computes with the threads a real rank of its world would get on this host
    # (one of N ranks sharing the cores), so its step time is that rank's compute time: the
    # twin real cells are set against (bench/studies/exposed_comm.py). Both counts are of the
    # CPUs the ranks share, read before this rank is bound to its own block of them
    resolved = ResolvedCell.of(cell)
    cell = resolved.cell
    threads = threads_per_rank(world_size if cell.simulate else local_world_size)
    host_cores, host_cpus = available_cores(), own_cpus()
    bound = bind_from_environment()  # every thread, so those it starts later too
    if bound:
        leave_comm_threads_free(host_cpus)  # a process group's threads: on any core the ranks share
    torch.set_num_threads(threads)
    device = _rank_device(cell, local_rank)
    strategy, workload = resolved.strategy, resolved.workload
    pg = _process_group(cell, strategy, device, rank=rank, processes=processes, world_size=world_size)

    ctx = RankContext(
        rank=rank,
        world_size=world_size,
        device=device,
        process_group=pg,
        precision=cell.precision,
        shard_group=cell.shard_group,
    )
    if cell.fake:
        workload.check_plannable()
    strategy.init_world(ctx)  # outside fake mode: a device mesh needs real values
    with (
        fake_tensor_mode() if cell.fake else contextlib.nullcontext(),
        CudaAttention() if planned_off_device(cell) else contextlib.nullcontext(),
    ):
        result = _train_and_measure(
            resolved,
            ctx,
            rank=rank,
            processes=processes,
            fault=fault,
            started=started,
            counts=counts if counts is not None else StepCounts(),
        )
    result.placement = placement(cell, 1 if cell.simulate else local_world_size, host_cores, bound)
    return result


def placement(
    cell: CellConfig, local_ranks: int, cores: int, bound: tuple[int, ...] | None = None
) -> dict[str, int]:
    """The cell's ranks on this host and what they run on: the ``cores`` the ranks share, or the
    CUDA devices (``Record.placement``; more ranks than either take turns on them); ``bound``:
    the cores this rank was bound to, where the launcher bound it (``core_binding``)."""
    if cell.device == "cuda" and not planned_off_device(cell):
        return {"ranks": local_ranks, "devices": torch.cuda.device_count()}
    placed = {"ranks": local_ranks, "cores": cores}
    return {**placed, "bound_cores_each": len(bound)} if bound else placed


def build_model(workload: Any, cell: CellConfig, device: torch.device) -> torch.nn.Module:
    """The workload's model, every parameter and buffer on ``device``. Built under the device
    context (no host copy of a large model), then moved, because some libraries' modules
    allocate with constructors that ignore that context (transformers' ImageGPTLayerNorm uses
    ``torch.Tensor(n)``; on a GPU its weights stayed on the CPU and DDP refused the model).

    Activation checkpointing is applied here, before any strategy wraps the model (as
    torchtitan does before ``fully_shard``): a wrapper's hooks then run around each
    checkpointed unit, and its recompute sees the parameters the wrapper gathered."""
    with torch.device(device):
        model = workload.build(cell.preset, dropout=cell.dropout)
    stray = any(t.device != device for t in [*model.parameters(), *model.buffers()])
    if stray:  # (a no-op .to still swaps fake tensors: avoid it)
        model = model.to(device)
    if cell.activation_checkpointing:
        apply_activation_checkpointing(model, workload.checkpoint_units(model))
    return model


def _train_and_measure(
    resolved: ResolvedCell,
    ctx: RankContext,
    *,
    rank: int,
    processes: int,
    fault: Fault | None,
    started: float,
    counts: StepCounts,
) -> RankResult:
    """Build and wrap the model, then run the phases (``phases.py``) and assemble the result."""
    cell, strategy, workload = resolved.cell, resolved.strategy, resolved.workload
    torch.manual_seed(cell.seed)  # identical initial weights on every rank
    model = build_model(workload, cell, ctx.device)
    drop_where_nvml_cannot_answer()  # a model's library may have set it on import (nvml_check.py)
    num_params = sum(p.numel() for p in model.parameters())
    num_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    # before the strategy wraps the model: no collective, no hook sees the count (counting.py)
    flops, flops_note, op_calls = (
        cell_flops(cell, workload, model, ctx.device, 0, counts) if rank == 0 else (None, None, None)
    )
    per_process = 1 if cell.simulate else ctx.world_size // processes
    data_ranks = range(rank * per_process, (rank + 1) * per_process)
    timing_bare = time.perf_counter()
    bare = _bare_compute(cell, workload, model, ctx, data_ranks)
    started += time.perf_counter() - timing_bare  # not set-up: the slow-start note must not count it
    model, optimizer, autocast_dtype, ctx = _wrapped(cell, strategy, workload, model, ctx)
    setup_s = time.perf_counter() - started
    model.train()
    wrapped = (model, optimizer, ctx.device, rank, data_ranks, autocast_dtype, fault)
    steps = CellSteps(cell, strategy, workload, *wrapped)
    artifacts: dict[str, str] = {}
    timing, memory, overlap = _phases(steps, cell, ctx.world_size, artifacts)
    peak, flops_note = _rank_peak(cell, ctx, rank, flops, flops_note)
    settings = _settings(cell, strategy, model, timing, memory)
    # what the rank's optimizer steps over (``metrics/optimizer_tensors.py``), before teardown:
    # a peer's engine is gone after
    optimizer_tensors = _counted(stepped_tensors, optimizer)
    tensor_elements = _counted(stepped_elements, optimizer)
    dtensor_shapes = _counted(stepped_dtensor_shapes, optimizer)
    strategy.teardown()
    return RankResult(
        rank=rank,
        num_params=num_params,
        num_trainable=num_trainable,
        step_times=timing.step_times,
        step_phases=timing.phases,
        startup_s={"setup": setup_s, "first_step": timing.first_step_s},
        losses=timing.losses,
        tracked_peak=memory.peak,
        breakdown=memory.breakdown,
        model_state=memory.model_state,
        cuda_allocator=timing.cuda_allocator,
        settings=settings,
        artifacts=artifacts,
        comm=memory.comm,
        comm_overlap=overlap,
        threads=torch.get_num_threads(),
        comm_shape=comm_shape_of(resolved) if rank == 0 else None,
        flops=flops,
        flops_note=flops_note,
        op_calls=op_calls,
        peak=peak,
        bare_compute=bare,
        optimizer_tensors=optimizer_tensors,
        optimizer_tensor_elements=tensor_elements,
        optimizer_dtensor_shapes=dtensor_shapes,
    )


def _counted(count: Callable[[Any], Any], optimizer: Any) -> Any:
    """``count(optimizer)``; None where a peer's optimizer cannot be read (the figure only,
    never the cell)."""
    try:
        return count(optimizer)
    except Exception:  # noqa: BLE001 - a peer's optimizer of an unknown shape
        return None


def _bare_compute(
    cell: CellConfig, workload: Any, model: torch.nn.Module, ctx: RankContext, data_ranks: range
) -> dict[str, Any] | None:
    """A real CPU cell's forward and backward timed on a copy of the bare model, every rank at
    once (``prediction/bare_compute.py``): the step-time model's compute term. Before the strategy
    wraps the model, so no hook or collective of its is in it; a timing that fails costs the cell
    this figure only."""
    if cell.device != "cpu" or cell.fake or cell.simulate:
        return None
    from shardbench.harness.config import available_memory
    from shardbench.precision import compute_dtype
    from shardbench.prediction.bare_compute import fits, time_forward_backward

    grouped = ctx.process_group is not None and dist.is_initialized()
    # every rank on this host copies the model at once (at most the world); decided together, as
    # the passes may hold collectives: a rank that skipped them would leave the others waiting
    fitting = fits(model, ctx.world_size, available_memory())
    if grouped:  # (the all-reduce is also the barrier that starts the passes together)
        fitting = _slowest(ctx.process_group, -float(fitting)) < 0
    if not fitting:
        return None
    try:
        batch = functools.partial(workload.batch, cell.preset, cell.batch_size, seed=cell.seed, step=0)
        inputs = concat_inputs([batch(rank=r, device=ctx.device) for r in data_ranks])
        return time_forward_backward(
            model,
            workload.loss,
            inputs,
            device=ctx.device,
            autocast=compute_dtype(cell.precision),
            agree=functools.partial(_slowest, ctx.process_group) if grouped else float,
            most=max(1, cell.steps),
            world_size=ctx.world_size if grouped else None,
        )
    except Exception:  # noqa: BLE001 - a timing that fails costs the figure only
        return None


def _slowest(group: Any, seconds: float) -> float:
    """The largest of every rank's ``seconds`` (a collective: every rank of ``group`` calls it)."""
    value = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return float(value)


def _wrapped(
    cell: CellConfig, strategy: Any, workload: Any, model: torch.nn.Module, ctx: RankContext
) -> tuple[Any, Any, torch.dtype | None, RankContext]:
    """The model as the strategy wraps it, its optimizer, the autocast dtype, and the rank's
    context with the workload's shard units."""
    if (units := workload.shard_units(model)) is not None:
        ctx = dataclasses.replace(ctx, shard_units=tuple(units))
    model, autocast_dtype = strategy.prepare_precision(model, cell.precision)
    optimizer_factory = workload.optimizer_factory()
    if cell.fake:  # FakeTensors would make torch fall back to its loop: pin what the device runs
        optimizer_factory = pinned_factory(optimizer_factory, cell.device)
    model, optimizer = strategy.setup(model, optimizer_factory, ctx)
    # a simulated world's collectives move no data, so a scaler would read garbage gradients as
    # an overflow and skip every step: its optimizer state would never exist to be measured
    strategy.scaler = None if cell.simulate or cell.fake else strategy.loss_scaler(optimizer, ctx)
    drop_where_nvml_cannot_answer()  # and a peer's, imported by its setup
    return model, optimizer, autocast_dtype, ctx


def _phases(
    steps: CellSteps, cell: CellConfig, world_size: int, artifacts: dict[str, str]
) -> tuple[Any, Memory, dict[str, float] | None]:
    """The timed steps, then the tracked memory and the traced step where the cell asks."""
    memory, overlap = Memory(), None
    try:
        timing = time_steps(steps)
        if cell.track_memory:
            memory = measure_memory(steps, world_size, artifacts)
        if cell.trace:
            overlap = trace_step(steps, artifacts)
    except Diverged:
        raise
    except Exception as e:  # noqa: BLE001 - re-raised with the step it happened at
        raise StepFailed(steps.step, e) from e
    return timing, memory, overlap


def _rank_peak(
    cell: CellConfig, ctx: RankContext, rank: int, flops: FlopsPerStep | None, note: str | None
) -> tuple[dict[str, Any] | None, str | None]:
    """Rank 0 of a CUDA cell: its device's peak, or None and why (a failed probe costs the cell
    its MFU only)."""
    if rank != 0 or flops is None or ctx.device.type != "cuda" or cell.fake:
        return None, note
    try:
        return cuda_peak(flops.dtype or "fp32"), note
    except Exception as e:  # noqa: BLE001 - a failed probe costs the cell its MFU only
        return None, f"no peak FLOP/s ({type(e).__name__}: {e})"


def _settings(cell: CellConfig, strategy: Any, model: Any, timing: Any, memory: Memory) -> dict[str, Any]:
    """The strategy's settings, with its loss scale, the kernels the memory assumed and how the
    cell was planned."""
    settings = strategy.settings()
    if (scale := strategy.loss_scale()) is not None:
        settings["loss_scale"] = {
            "scale": scale,
            "warmup_added": timing.warmup_added,
            "skipped_warmup": timing.skipped_warmup,
            "skipped_timed": timing.skipped_timed,
            "skipped_tracked": strategy.skipped_steps - timing.skipped_warmup - timing.skipped_timed,
        }
    if memory.kernels is not None:
        settings["kernels"] = memory.kernels
    if planned_off_device(cell):
        settings["planned_for"] = f"{cell.device}, planned on the CPU"
    if getattr(model, "planned_note", None):  # a stand-in for a wrapper fake tensors cannot build
        settings["planned"] = model.planned_note
    return settings


def run_rank_safely(cell: CellConfig | ResolvedCell, **kw: Any) -> RankResult:
    """``run_rank``, with any failure turned into a result carrying this rank's traceback."""
    try:
        return run_rank(cell, **kw)
    except BaseException as e:  # noqa: BLE001 - a failed cell is data, not a crash of the run
        step = getattr(e, "step", None)
        cause = e.cause if isinstance(e, StepFailed) else e
        status = "diverged" if isinstance(e, Diverged) else "oom" if _is_oom(cause) else "error"
        where = f" at step {step}" if step is not None else ""
        return RankResult(
            rank=kw["rank"],
            status=status,
            failed_at=time.time(),
            step=step,
            error=f"rank {kw['rank']}{where}: {type(cause).__name__}: {cause}\n{traceback.format_exc()}",
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m shardbench.harness.worker", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--cell", required=True, help="cell config: a JSON file or a JSON string")
    ap.add_argument("--result-dir", type=Path, help="(launcher) write rank<R>.json here")
    ap.add_argument("--out", type=Path, help="(torchrun) rank 0 appends the record to OUT/records.jsonl")
    ap.add_argument("--run-id", default=None)
    args = ap.parse_args(argv)
    text = Path(args.cell).read_text() if not args.cell.lstrip().startswith("{") else args.cell
    cell = CellConfig.from_json(json.loads(text))
    env = os.environ
    try:  # the launcher's variables: a bad one ends the rank in one line, not a traceback
        rank = env_int(env, "RANK", minimum=0, default=0)
        processes = env_int(env, "WORLD_SIZE", minimum=1, default=1)
        local_rank = env_int(env, "LOCAL_RANK", minimum=0, default=rank)
        local_world_size = env_int(env, "LOCAL_WORLD_SIZE", minimum=1, default=processes)
        if args.result_dir is None:  # started by torchrun itself: its variables are the job's
            cell = dataclasses.replace(cell, ranks_per_node=job_ranks_per_node(cell.ranks_per_node))
            if cell.device == "cpu" and RANK_CORES not in env:  # as the launcher would bind it
                env.update(as_variable(unrestricted_cores_of(local_rank, local_world_size)))
    except ValueError as e:
        raise SystemExit(f"{ap.prog}: {e}") from None
    resolved = ResolvedCell.of(cell)  # its workload is resolved by the rank, where a failure is data
    plan = resolved.world_plan()
    kw: dict[str, Any] = dict(
        rank=rank,
        world_size=plan.reported_world_size(processes),
        processes=processes,
        local_rank=local_rank,
        local_world_size=local_world_size,
    )
    start = time.perf_counter()
    kw["counts"] = counts = StepCounts()
    if args.result_dir is not None and rank == 0:  # the counter: what earlier cells counted
        counts.adopt(args.result_dir / HANDED)
    try:
        kw["fault"] = next((f for f in faults_from_env() if f.applies_to(cell.strategy)), None)
    except ValueError as e:
        result = RankResult(rank=rank, status="error", error=f"rank {rank}: {e}", failed_at=time.time())
    else:
        result = run_rank_safely(resolved, **kw)
    if args.result_dir is not None:  # launched by shardbench.harness.launch: it assembles the record
        result.write(args.result_dir / f"rank{rank}.json")
        with contextlib.suppress(OSError):  # a count not handed on is made again, nothing lost
            counts.export(args.result_dir / COUNTED, own_only=True)
        if dist.is_initialized() and result.status == "ok":
            dist.destroy_process_group()
        return 0 if result.status == "ok" else 1
    return _torchrun_finish(resolved, plan, result, args, rank=rank, processes=processes, start=start)


def _torchrun_finish(
    cell: ResolvedCell,
    plan: Any,
    result: RankResult,
    args: argparse.Namespace,
    *,
    rank: int,
    processes: int,
    start: float,
) -> int:
    """Under torchrun: gather every rank's result on rank 0, which writes the record."""
    from shardbench.harness.result import build_record
    from shardbench.records import append_record

    gathered: list[Any] = [None] * processes if rank == 0 else []
    if dist.is_initialized():
        dist.gather_object(result.to_json(), gathered if rank == 0 else None, dst=0)
    else:
        gathered = [result.to_json()]
    if rank == 0:
        out = args.out or Path("results/runs") / (args.run_id or time.strftime("%Y%m%d-%H%M%S"))
        record = build_record(
            cell,
            plan,
            [RankResult.from_json(r) for r in gathered],
            run_id=args.run_id or out.name,
            wall_s=time.perf_counter() - start,
            processes=processes,
        )
        append_record(out / "records.jsonl", record)
        print(json.dumps(record.to_json(), indent=1))
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if result.status == "ok" else 1


if __name__ == "__main__":
    guard_launcher_child()  # an exec'd rank ends with its launcher, and leaves Ctrl-C to it
    sys.exit(main())
