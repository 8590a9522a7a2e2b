"""What one rank does for one cell: build the workload, wrap it with the strategy, warm up,
time the steps, then measure memory by category over a few more steps.

Timing and memory tracking are separate phases on purpose: the memory tracker is a dispatch mode
that slows every op, so timed steps run without it. Run directly by ``bench.harness.launch`` (one process
per rank, result written to a file) or by torchrun for multi-node runs::

    torchrun --nnodes 2 --nproc-per-node 8 ... -m bench.harness.worker --cell cell.json --out results/runs/x

Under torchrun, rank 0 gathers every rank's result and appends the record to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench.harness.config import CellConfig
from bench.metrics.memory import MemoryProbe, cuda_allocator_stats, reset_cuda_peaks
from bench.metrics.timing import timed
from bench.strategies.base import RankContext
from bench.strategies.registry import get_strategy
from models.base import concat_inputs
from models.registry import get_workload

MEMORY_STEPS = 2  # steady-state steps tracked for the breakdown (optimizer state exists by then)


def threads_per_rank(local_world_size: int) -> int:
    """Share the cores among the ranks on this host: N ranks with default threads each
    oversubscribe the CPU (measured: 4 ranks on 2 cores ran 2x slower)."""
    return max(1, (os.cpu_count() or 1) // max(1, local_world_size))


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


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def run_rank(
    cell: CellConfig, *, rank: int, world_size: int, processes: int, local_rank: int, local_world_size: int
) -> dict[str, Any]:
    """Run one cell on this rank; return its measurements (raises on failure)."""
    torch.set_num_threads(threads_per_rank(local_world_size))
    if cell.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        if cell.memory_budget_bytes is not None:  # emulate a smaller card: a real OOM past it
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, cell.memory_budget_bytes / total), device)
    else:
        device = torch.device("cpu")
    strategy = get_strategy(cell.strategy)
    workload = get_workload(cell.workload)
    pg = None
    if cell.simulate:
        init_fake_world(world_size)
        pg = dist.group.WORLD
    elif strategy.needs_process_group:
        if not dist.is_initialized():
            dist.init_process_group(
                "nccl" if device.type == "cuda" else "gloo",
                rank=rank,
                world_size=processes,
                timeout=timedelta(seconds=cell.timeout_s),
                **({"device_id": device} if device.type == "cuda" else {}),
            )
        pg = dist.group.WORLD
    if cell.inject_failure == "raise" and rank == processes - 1:
        raise RuntimeError(f"injected failure on rank {rank}")
    if cell.inject_failure == "hang" and rank == processes - 1:
        time.sleep(10 * cell.timeout_s)

    ctx = RankContext(
        rank=rank, world_size=world_size, device=device, process_group=pg, precision=cell.precision
    )
    if cell.fake:
        workload.check_plannable()
    strategy.init_world(ctx)  # outside fake mode: a device mesh needs real values
    with fake_tensor_mode() if cell.fake else contextlib.nullcontext():
        return _train_and_measure(cell, strategy, workload, ctx, rank=rank, processes=processes)


def _train_and_measure(
    cell: CellConfig, strategy: Any, workload: Any, ctx: RankContext, *, rank: int, processes: int
) -> dict[str, Any]:
    device, world_size = ctx.device, ctx.world_size
    torch.manual_seed(cell.seed)  # identical initial weights on every rank
    with torch.device(device):
        model = workload.build(cell.preset, dropout=cell.dropout)
    num_params = sum(p.numel() for p in model.parameters())
    model, use_autocast = strategy.prepare_precision(model, cell.precision)
    model, optimizer = strategy.setup(model, workload.optimizer_factory(), ctx)
    model.train()

    # Each process covers world_size/processes data ranks (dp drives several devices from one);
    # a simulated world's one process is rank 0 and trains rank 0's data only.
    per_process = 1 if cell.simulate else world_size // processes
    data_ranks = range(rank * per_process, (rank + 1) * per_process)

    def batch(step: int) -> Any:
        return concat_inputs(
            [
                workload.batch(cell.preset, cell.batch_size, seed=cell.seed, step=step, rank=r, device=device)
                for r in data_ranks
            ]
        )

    def loss_fn(m: torch.nn.Module, inputs: Any) -> torch.Tensor:
        autocast = (
            torch.autocast(device.type, dtype=torch.bfloat16) if use_autocast else contextlib.nullcontext()
        )
        with autocast:
            return workload.loss(m, inputs)

    step = 0
    # Under --fake nothing is timed, so warm-up is skipped: the tracked steps include the first
    # (optimizer state created) and a steady one, which is all the memory phase needs.
    for _ in range(0 if cell.fake else cell.warmup):
        strategy.train_step(model, optimizer, batch(step), loss_fn)
        step += 1

    reset_cuda_peaks(device)
    step_times, losses = [], []
    for _ in range(0 if cell.fake else cell.steps):  # fake tensors: no values, no meaningful time
        step_fn = functools.partial(strategy.train_step, model, optimizer, batch(step), loss_fn)
        loss, seconds = timed(step_fn, device)
        step_times.append(seconds)
        losses.append(float(loss))
        step += 1
    allocator = cuda_allocator_stats(device)

    tracked_peak, breakdown, model_state = None, None, None
    if cell.track_memory:
        # Inputs are made before tracking starts, so they count as "other", not as activations.
        inputs = [batch(step + i) for i in range(MEMORY_STEPS)]
        probe = MemoryProbe(device, [model, optimizer, inputs], typed=strategy.memory_tensors())
        strategy.observe_memory(probe.attribute)
        with probe:
            for step_inputs in inputs:
                strategy.train_step(model, optimizer, step_inputs, loss_fn)
                probe.next_step()
            # after a step, before the next zero_grad: exactly the model states a rank keeps
            model_state = probe.current_model_state()
        del inputs
        strategy.observe_memory(None)
        tracked_peak, breakdown = probe.peak()
    settings = strategy.settings()
    if getattr(model, "planned_note", None):  # a stand-in for a wrapper fake tensors cannot build
        settings["planned"] = model.planned_note
    strategy.teardown()
    return {
        "rank": rank,
        "status": "ok",
        "num_params": num_params,
        "step_times": step_times,
        "losses": losses,
        "tracked_peak": tracked_peak,
        "breakdown": breakdown,
        "model_state": model_state,
        "cuda_allocator": allocator,
        "settings": settings,
    }


def run_rank_safely(cell: CellConfig, **kw: Any) -> dict[str, Any]:
    """``run_rank``, with any failure turned into a result carrying this rank's traceback."""
    try:
        return run_rank(cell, **kw)
    except BaseException as e:  # noqa: BLE001 - a failed cell is data, not a crash of the run
        return {
            "rank": kw["rank"],
            "status": "oom" if _is_oom(e) else "error",
            "failed_at": time.time(),
            "error": f"rank {kw['rank']}: {type(e).__name__}: {e}\n{traceback.format_exc()}",
        }


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.harness.worker", description=__doc__.split("\n")[0])
    ap.add_argument("--cell", required=True, help="cell config: a JSON file or a JSON string")
    ap.add_argument("--result-dir", type=Path, help="(launcher) write rank<R>.json here")
    ap.add_argument("--out", type=Path, help="(torchrun) rank 0 appends the record to OUT/records.jsonl")
    ap.add_argument("--run-id", default=None)
    args = ap.parse_args(argv)
    text = Path(args.cell).read_text() if not args.cell.lstrip().startswith("{") else args.cell
    cell = CellConfig.from_json(json.loads(text))
    rank, processes = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    plan = get_strategy(cell.strategy).plan_world(cell.world_size, cell.device, cell.simulate)
    kw = dict(
        rank=rank,
        world_size=plan.world_size if processes == plan.processes else processes,
        processes=processes,
        local_rank=_env_int("LOCAL_RANK", rank),
        local_world_size=_env_int("LOCAL_WORLD_SIZE", processes),
    )
    start = time.perf_counter()
    result = run_rank_safely(cell, **kw)
    if args.result_dir is not None:  # launched by bench.harness.launch: it assembles the record
        (args.result_dir / f"rank{rank}.json").write_text(json.dumps(result))
        if dist.is_initialized() and result["status"] == "ok":
            dist.destroy_process_group()
        return 0 if result["status"] == "ok" else 1
    # torchrun: gather every rank's result on rank 0, which writes the record.
    from bench.harness.launch import build_record

    gathered: list[Any] = [None] * processes if rank == 0 else []
    if dist.is_initialized():
        dist.gather_object(result, gathered if rank == 0 else None, dst=0)
    else:
        gathered = [result]
    if rank == 0:
        from bench.harness.records import append_record

        out = args.out or Path("results/runs") / (args.run_id or time.strftime("%Y%m%d-%H%M%S"))
        record = build_record(
            cell,
            plan,
            gathered,
            run_id=args.run_id or out.name,
            wall_s=time.perf_counter() - start,
            processes=processes,
        )
        append_record(out / "records.jsonl", record)
        print(json.dumps(record.to_json(), indent=1))
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
