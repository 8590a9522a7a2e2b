"""One rank's typed result, and how a cell's record is assembled from all of them.

The contract between a rank and whoever collects it (``shardbench.harness.launch`` on one host,
rank 0 under torchrun) is ``RankResult``: written as JSON by the rank, read back here. Keeping
record assembly in its own module makes the dependencies one-way: launch -> worker -> result.

Root cause: when a cell fails, the record blames one rank. A rank that vanished, killed by a
signal from outside (the OOM killer, ``kill -9``) or ended with an exit code (``os._exit`` in user
code) without writing a result, is the cause ahead of ranks that then raised because their peer
vanished; among ranks that raised, the earliest; ranks the launcher stopped itself (after
the grace period or at the deadline) are never the cause and are listed as such.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardbench.harness.config import CellConfig
from shardbench.harness.resolved_cell import ResolvedCell
from shardbench.metrics.timing import slowest_phases, slowest_rank, summarize
from shardbench.prediction.machine_probes import MachineProbes
from shardbench.prediction.op_calls import OpCall, calls_from_json, calls_to_json
from shardbench.prediction.zero_accounting import predict, predict_comm, workload_params
from shardbench.records import UNNAMED_DEVICE, Record, capture_env, finite, first_line
from shardbench.step_figures import BareCompute, FlopsPerStep, PredictedStep
from shardbench.step_figures import from_json as figures
from shardbench.strategies.catalog import WorldPlan

if TYPE_CHECKING:
    from shardbench.strategies.base import Strategy


@dataclass
class RankResult:
    """What one rank reports for one cell (``status`` ok or how it failed)."""

    rank: int
    status: str = "ok"
    error: str | None = None
    #: wall-clock time (time.time()) the failure was seen: orders failures across ranks
    failed_at: float | None = None
    #: the step (warm-up included, from 0) at which the rank failed or diverged
    step: int | None = None
    #: the signal that ended the process, when it died without reporting (set by the launcher)
    signal: str | None = None
    #: the launcher stopped this rank itself (a peer failed first, or the deadline passed)
    stopped_by_launcher: bool = False
    #: the process ended (an exit code, a signal) without writing a result: it did not raise,
    #: it vanished, and its peers' errors ("connection reset") are the consequence
    vanished: bool = False
    num_params: int | None = None
    #: of them, the parameters that take gradients (a frozen one has no gradient, no Adam state)
    num_trainable: int | None = None
    step_times: list[float] = field(default_factory=list)
    #: per timed step on a CPU: the seconds of its forward, backward and optimizer step
    step_phases: list[dict[str, float]] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)
    tracked_peak: int | None = None
    breakdown: dict[str, int] | None = None
    model_state: dict[str, int] | None = None
    cuda_allocator: dict[str, int] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    #: drill-down files this rank wrote: label -> absolute path
    artifacts: dict[str, str] = field(default_factory=dict)
    #: the collectives of one tracked step (``shardbench.metrics.comm.CollectiveCounter.summary``)
    comm: dict[str, Any] | None = None
    #: ``--trace`` on CUDA: NCCL kernel time and how much compute kernels hid (drilldown.py)
    comm_overlap: dict[str, float] | None = None
    #: torch's intra-op threads on this rank
    threads: int | None = None
    #: rank 0: the workload's parameter shapes for the communication prediction
    #: (``comm_shape_of``; built here, where the workload's imports are already paid, so the
    #: launcher never imports a model library just to predict)
    comm_shape: dict[str, Any] | None = None
    #: seconds before the first step (``setup``: imports, process group, model, strategy) and
    #: of the first warm-up step (``first_step``): what a slow start is made of
    startup_s: dict[str, float | None] | None = None
    #: the cell's ranks on this rank's host and what they ran on (``Record.placement``)
    placement: dict[str, int] | None = None
    #: rank 0: the FLOPs of one step of its batch (``harness.counting.cell_flops``), or why
    #: they were not counted
    flops: FlopsPerStep | None = None
    flops_note: str | None = None
    #: rank 0: the counted pass's operator calls (``bench/prediction/op_calls.py``), which the
    #: launcher replays for the step's compute time; not part of the record
    op_calls: tuple[OpCall, ...] | None = None
    #: the bare model's forward and backward on this rank, timed before the strategy wrapped it
    #: (``prediction/bare_compute.py``); None where not taken
    bare_compute: dict[str, Any] | None = None
    #: the tensors this rank's optimizer steps over (``metrics/optimizer_tensors.py``)
    optimizer_tensors: int | None = None
    #: the elements of each of them, in the order they are stepped
    optimizer_tensor_elements: list[int] | None = None
    #: the global shapes of the DTensors among them, in the order they are stepped
    optimizer_dtensor_shapes: list[list[int]] | None = None
    #: rank 0 of a CUDA cell: its device's peak FLOP/s (``bench/prediction/peaks.py``)
    peak: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.flops = figures(FlopsPerStep, self.flops)  # as JSON carries it from the rank

    def to_json(self) -> dict[str, Any]:
        calls = calls_to_json(self.op_calls) if self.op_calls is not None else None
        return finite({**asdict(replace(self, op_calls=None)), "op_calls": calls})

    @staticmethod
    def from_json(d: dict[str, Any]) -> RankResult:
        fields = {k: v for k, v in d.items() if k in RankResult.__dataclass_fields__}
        if fields.get("op_calls") is not None:
            fields["op_calls"] = calls_from_json(fields["op_calls"])
        return RankResult(**fields)

    def write(self, path: Path) -> None:
        """Write atomically (rename), so the launcher never reads half a result."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), allow_nan=False))
        tmp.replace(path)

    @staticmethod
    def read(path: Path) -> RankResult:
        return RankResult.from_json(json.loads(path.read_text()))


def signal_name(returncode: int | None) -> str | None:
    """``SIGKILL`` for a process that ended with return code -9; None if no signal ended it."""
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def root_cause(results: list[RankResult]) -> RankResult | None:
    """The rank to blame for a failed cell (see the module docstring); None if all are ok."""
    bad = [r for r in results if r.status != "ok"]
    if not bad:
        return None
    candidates = [r for r in bad if not r.stopped_by_launcher] or bad

    def order(r: RankResult) -> tuple[int, float]:
        killed = (r.signal is not None or r.vanished) and r.status != "timeout"
        return (0 if killed else 1 if r.failed_at is not None else 2, r.failed_at or float("inf"))

    return min(candidates, key=order)


def _failure(results: list[RankResult]) -> tuple[str, str, dict[str, Any]] | None:
    """The cell's status, error text and failure summary, or None when every rank is ok."""
    first = root_cause(results)
    if first is None:
        return None
    stopped = [r.rank for r in results if r.stopped_by_launcher]
    others = [
        f"  {first_line(r.error, 200)}"
        for r in results
        if r.status != "ok" and r is not first and not r.stopped_by_launcher
    ]
    error = first.error or f"rank {first.rank}: {first.status}"
    if others:
        error += "\nother ranks:\n" + "\n".join(others)
    if stopped:
        error += (
            f"\nstopped by the launcher: rank{'s' if len(stopped) > 1 else ''} {', '.join(map(str, stopped))}"
        )
    failure = {"rank": first.rank, "signal": first.signal, "step": first.step, "stopped_by_launcher": stopped}
    if first.status == "interrupted":  # the run was stopped from outside: no rank is to blame
        failure.update(rank=None, stopped_by_launcher=[r.rank for r in results])
    return first.status, error, failure


def cell_fields(cell: CellConfig) -> dict[str, Any]:
    """The record fields that come from the cell as asked for, whatever ran."""
    return {
        "suite": cell.suite,
        "workload": cell.workload,
        "preset": cell.preset,
        "requested_world_size": cell.world_size,
        "fake": cell.fake,
        "activation_checkpointing": cell.activation_checkpointing,
        "device": cell.device,
        "precision": cell.precision,
        "batch_size_per_rank": cell.batch_size,
        "shard_group": cell.shard_group,
        "steps": cell.steps,
        "warmup": cell.warmup,
        "repeat": cell.repeat,
    }


def build_record(
    cell: CellConfig | ResolvedCell,
    plan: WorldPlan,
    results: list[RankResult],
    *,
    run_id: str,
    wall_s: float,
    processes: int,
) -> Record:
    """Assemble the cell's record from every rank's result."""
    resolved = ResolvedCell.of(cell)
    cell, strategy = resolved.cell, resolved.strategy
    results = sorted(results, key=lambda r: r.rank)
    world_size = plan.reported_world_size(processes)
    failure = _failure(results)
    ok = [r for r in results if r.status == "ok"]
    num_params = ok[0].num_params if ok and ok[0].num_params else workload_params(resolved)
    backend = _backend(resolved, plan)
    record = Record(
        **cell_fields(cell),
        run_id=run_id,
        params=num_params,
        strategy=strategy.name,
        world_size=world_size,
        simulated=plan.simulated,
        backend=backend,
        status="ok",
        note=_note(cell, plan, ok, startup := _startup(results)),
        startup_s=startup,
        strategy_settings=ok[0].settings if ok else strategy.settings(),
        predicted_mem_bytes=predict(
            resolved, world_size, num_params, ok[0].num_trainable if ok and ok[0].num_params else None
        ),
        wall_s=wall_s,
        env=capture_env(cell.device),
        artifacts=_artifacts(cell, results),
        comm_per_step=ok[0].comm if ok else None,
        threads_per_rank=ok[0].threads if ok else None,
        placement=_placement(results),
        # the most exposed rank's: the one the others wait for
        comm_overlap=max(
            (r.comm_overlap for r in ok if r.comm_overlap),
            key=lambda o: o["exposed_fraction"],
            default=None,
        ),
        predicted_comm=predict_comm(
            resolved, world_size, backend, next((r.comm_shape for r in ok if r.comm_shape), None)
        ),
    )
    first_losses = results[0].losses if results else []
    record.loss = {"first": first_losses[0], "last": first_losses[-1]} if first_losses else None
    if failure is not None:
        record.status, record.error, record.failure = failure
        return record
    _add_measured(record, resolved, plan, results)
    return record


def _add_measured(record: Record, resolved: ResolvedCell, plan: WorldPlan, results: list[RankResult]) -> None:
    """What a cell whose ranks all finished measured, and what the step-time model predicts of
    it over this machine's probes."""
    steps = slowest_rank([r.step_times for r in results])
    times = summarize(steps)
    cell = resolved.cell
    record.step_time_s = times
    record.step_times_s = steps or None
    record.step_phases_s = slowest_phases([r.step_phases for r in results])
    # the slowest rank's, as the slowest rank paces a step (where the ranks agreed on each pass,
    # every rank holds the same figure)
    record.bare_compute = figures(
        BareCompute,
        max((r.bare_compute for r in results if r.bare_compute), key=lambda b: b["seconds"], default=None),
    )
    record.optimizer_tensors = max((r.optimizer_tensors or 0 for r in results), default=0) or None
    # the rank that updates the most elements: its update is the slowest
    record.optimizer_tensor_elements = max(
        (r.optimizer_tensor_elements for r in results if r.optimizer_tensor_elements), key=sum, default=None
    )
    record.optimizer_dtensor_shapes = next(
        (r.optimizer_dtensor_shapes for r in results if r.optimizer_dtensor_shapes), None
    )
    if times and times["median"] > 0 and not plan.simulated:  # simulated: no communication timed
        record.samples_per_s = cell.batch_size * record.world_size / times["median"]
    _add_throughput(record, cell, results)
    probes = MachineProbes()
    _add_compute_replay(record, results, probes)
    _add_prediction(record, probes, resolved.strategy)
    _add_memory(record, cell, results)


def _add_compute_replay(record: Record, results: list[RankResult], probes: MachineProbes) -> None:
    """A CPU cell's forward and backward replayed op by op at a rank's threads, as many copies at
    once as the cell has ranks on this host's cores (``replay_copies``), cached in the results
    home (``MachineProbes.replayed_compute``): the step-time model's compute term. Made here,
    after the ranks ended, so the replay has the cores to itself; one whose calls would not fit
    in half the free memory is not made (the model falls back to FLOPs at a stated efficiency),
    and a failed one costs the record its replay only."""
    calls = next((r.op_calls for r in results if r.op_calls), None)
    if record.device != "cpu" or record.status != "ok" or not calls:
        return
    from shardbench.harness.config import available_memory
    from shardbench.prediction.op_calls import largest_call_bytes
    from shardbench.prediction.record_step_time import rank_threads, replay_copies

    why = None
    try:
        copies = replay_copies(record)
        need = copies * largest_call_bytes(calls)  # each copy's largest call, inputs and output
        free = available_memory()
        if free is not None and need > free / 2:
            why = f"compute not replayed (its largest call needs {need:,} bytes, over half the free memory)"
        else:
            record.compute_replay = probes.replayed_compute(
                calls,
                rank_threads(record),
                copies,
                record.env.get("device_name") or UNNAMED_DEVICE,
                record.env.get("torch") or "?",
            )
    except Exception as e:  # noqa: BLE001 - a failed replay costs the cell its replay only
        why = f"compute not replayed ({type(e).__name__}: {e})"
    if why:
        record.note = "; ".join(p for p in (record.note, why) if p)


def _add_prediction(record: Record, probes: MachineProbes, strategy: Strategy) -> None:
    """A measured cell's predicted step time over its device's default network profile (gloo
    measured here on a CPU, in two tiers where the cell's ranks are placed on nodes; NVLink on
    CUDA): what the run checks its step-time model with. Made
    here, after the ranks ended, so the probes it may run have the cores to themselves; a
    prediction that cannot be made costs the record its prediction only."""
    if record.simulated or record.status != "ok" or not record.step_time_s:
        return
    from shardbench.prediction.network_profiles import default_network
    from shardbench.prediction.record_step_time import predict_record

    _pool_bare_compute(record, probes.home)
    try:
        network = default_network(record.device)
        per_node = (record.comm_per_step or {}).get("ranks_per_node")  # nodes: gloo in two tiers
        record.predicted_step_time, why = predict_record(
            record, network=network, probes=probes, strategy=strategy, ranks_per_node=per_node
        )
    except Exception as e:  # noqa: BLE001 - a failed probe costs the cell its prediction only
        why = f"no step time predicted ({type(e).__name__}: {e})"
    if why and record.flops_per_step:
        record.note = "; ".join(p for p in (record.note, why) if p)
    _check_model(record, probes.home)
    if record.predicted_step_time and record.predicted_step_time.compute_basis == "measured":
        try:  # what a plan would have predicted of this cell: the check of plan's own model
            as_planned, _ = predict_record(
                record,
                network=network,
                probes=probes,
                strategy=strategy,
                ranks_per_node=per_node,
                timed_compute=False,
            )
        except Exception:  # noqa: BLE001 - the cell's own prediction and check stand without it
            as_planned = None
        _keep_check(record, as_planned, probes.home)


def _pool_bare_compute(record: Record, home: Path | None) -> None:
    """Keep the cell's bare pass with this machine's others of the same model and placement,
    and give the record their median (``prediction/bare_pool.py``); a pool that cannot be kept
    leaves the cell's own figure."""
    from shardbench.prediction.bare_pool import pooled

    try:
        kept = pooled(record, home)
    except OSError:
        return
    if kept and record.bare_compute:
        seconds, cells, passes = kept
        record.bare_compute = replace(
            record.bare_compute, pooled_seconds=seconds, pooled_cells=cells, pooled_passes=passes
        )


def _check_model(record: Record, home: Path | None) -> None:
    """The prediction's interval from this machine's earlier checks of the model on its compute's
    basis, then this cell's own check kept for the next (``prediction/model_error.py``)."""
    from shardbench.prediction.model_error import with_interval

    predicted = record.predicted_step_time
    if predicted is None:
        return
    device_name = record.env.get("device_name") or UNNAMED_DEVICE
    record.predicted_step_time = with_interval(predicted, device_name, record.device, home)
    _keep_check(record, predicted, home)


def _keep_check(record: Record, predicted: PredictedStep | None, home: Path | None) -> None:
    """Keep ``predicted`` over the record's measured median as a check of the model on the
    basis of its compute."""
    from shardbench.prediction.model_error import add_check

    measured = (record.step_time_s or {}).get("median")
    if predicted is None or not predicted.step or not measured:
        return
    check = {
        "device_name": record.env.get("device_name") or UNNAMED_DEVICE,
        "device": record.device,
        "compute": predicted.compute_basis,
        "ratio": predicted.step / measured,
        "workload": record.workload,
        "strategy": record.strategy,
        "world_size": record.world_size,
    }
    try:
        add_check(check, home)
    except OSError:  # a results home that cannot be written costs the check only, not the record
        pass


def _add_throughput(record: Record, cell: CellConfig, results: list[RankResult]) -> None:
    """FLOPs per step (rank 0's count), tokens/s, and where the step was timed, the FLOP/s a
    rank achieved and its MFU and HFU. A simulated cell's are its compute's (its step time
    has no communication in it, as its samples/s, which it does not have, would say)."""
    flops = next((r.flops for r in results if r.flops), None)
    why = next((r.flops_note for r in results if r.flops_note), None)
    record.flops_per_step = flops
    if flops and flops.tokens_per_sample and record.samples_per_s:
        record.tokens_per_s = record.samples_per_s * flops.tokens_per_sample
    median = (record.step_time_s or {}).get("median")
    if flops and median:
        record.achieved_flops_per_s = {"model": flops.model / median, "hardware": flops.hardware / median}
        try:
            peak = next((r.peak for r in results if r.peak), None) or _host_peak(cell, record, flops.dtype)
        except Exception as e:  # noqa: BLE001 - a failed probe costs the cell its MFU only
            peak, why = None, f"no peak FLOP/s ({type(e).__name__}: {e})"
        if peak:
            record.peak_flops_per_s = peak
            record.mfu = record.achieved_flops_per_s["model"] / peak["flops_per_s"]
            record.hfu = record.achieved_flops_per_s["hardware"] / peak["flops_per_s"]
    if why:
        record.note = "; ".join(p for p in (record.note, why) if p)


def _host_peak(cell: CellConfig, record: Record, dtype: str) -> dict[str, Any] | None:
    """A CPU cell's peak: this machine's GEMM probe at the cell's dtype and threads per rank,
    measured once and cached in the results home (``bench/prediction/peaks.py``). Run here, after
    the cell's ranks have ended, so the probe has the cores to itself. (A CUDA cell's rank 0
    resolved its own.)"""
    if cell.device != "cpu":
        return None
    from shardbench.prediction.peaks import measured_peak

    name = record.env.get("device_name") or UNNAMED_DEVICE
    return measured_peak("cpu", name, dtype, record.threads_per_rank, torch_version=record.env["torch"])


def _add_memory(record: Record, cell: CellConfig, results: list[RankResult]) -> None:
    allocators = [r.cuda_allocator for r in results]
    if all(a is not None for a in allocators) and not cell.fake:
        per_rank: list[int | None] = [a["max_allocated"] for a in allocators]  # type: ignore[index]
        source = "cuda max_memory_allocated"
    else:
        per_rank = [r.tracked_peak for r in results]
        source = "tracked tensors (MemTracker" + (", FakeTensorMode)" if cell.fake else ")")
    if any(p is None for p in per_rank):  # a timing-only cell (track_memory off) on CPU
        return
    peak_rank = max(range(len(results)), key=lambda i: per_rank[i] or 0)
    record.peak_mem_bytes = {
        "per_rank": per_rank,
        "max": per_rank[peak_rank],
        "source": source,
        "tracked_per_rank": [r.tracked_peak for r in results],
    }
    record.mem_breakdown_bytes = results[peak_rank].breakdown
    record.model_state_bytes = results[peak_rank].model_state
    record.cuda_allocator = allocators[peak_rank]


def _placement(results: list[RankResult]) -> dict[str, int] | None:
    """The most crowded host's placement: the ranks per core (or device) its ranks waited for."""
    placed = [p for r in results if (p := r.placement)]
    return max(placed, key=lambda p: p["ranks"] / (p.get("cores") or p.get("devices") or 1), default=None)


def _backend(resolved: ResolvedCell, plan: WorldPlan) -> str:
    if plan.simulated:
        return "fake"
    if not resolved.strategy.needs_process_group:
        return "none"
    return "nccl" if resolved.cell.device == "cuda" else "gloo"


def _artifacts(cell: CellConfig, results: list[RankResult]) -> dict[str, str] | None:
    """Every rank's drill-down files, as paths relative to the run directory (the parent of
    ``drill-down/``), so the report's links survive moving the directory."""
    found = {label: path for r in results for label, path in (r.artifacts or {}).items()}
    if not found or cell.drill_down_dir is None:
        return None
    run_dir = Path(cell.drill_down_dir).parent.parent

    def order(label: str) -> tuple[str, int]:  # "trace (rank 10)" after "trace (rank 2)"
        kind, _, rank = label.rpartition(" (rank ")
        return kind, int(rank.rstrip(")")) if rank.rstrip(")").isdigit() else -1

    return {label: os.path.relpath(found[label], run_dir) for label in sorted(found, key=order)}


FAKE_NOTE = "fake: planned under FakeTensorMode, nothing allocated, no step time"


#: seconds past which a cell's setup or first step is a slow start, said on the terminal and in
#: the record's note: the cell's wall time is then not what its steps cost
SLOW_START_S = 10.0
_PHASES = {"setup": "setup (imports, process group, model, strategy)", "first_step": "the first warm-up step"}


def _startup(results: list[RankResult]) -> dict[str, float | None] | None:
    """The slowest rank's setup and first step (``RankResult.startup_s``), None where no rank
    measured them."""
    measured = [r.startup_s for r in results if r.startup_s]
    if not measured:
        return None
    return {k: max((m[k] for m in measured if m.get(k) is not None), default=None) for k in _PHASES}


def slow_start(startup: dict[str, float | None] | None, step_s: float | None = None) -> str | None:
    """What took a cell's start past ``SLOW_START_S``, or None: "slow start: setup (...) took
    55 s (...)" (DeepSpeed building an op just in time, a first import, a cold cache). The first
    warm-up step is slow only by what it took beyond a timed step (``step_s``, the median): where
    every step of a large model takes 30 s, a first step of 30 s is the step, not a cold start."""
    expected = {"setup": 0.0, "first_step": step_s or 0.0}
    slow = [
        f"{_PHASES[k]} took {v:.0f} s"
        for k, v in (startup or {}).items()
        if k in _PHASES and v is not None and v - expected[k] > SLOW_START_S
    ]
    if not slow:
        return None
    return (
        f"slow start: {', '.join(slow)} (an op built just in time, e.g. DeepSpeed's, a first import "
        "or a cold cache; the timed steps exclude it)"
    )


def with_slow_start(line: str, record: Record) -> str:
    """A cell's progress line, with its slow start after it where it had one."""
    slow = slow_start(record.startup_s, (record.step_time_s or {}).get("median"))
    return f"{line}; {slow}" if slow else line


def _median_step(ok: list[RankResult]) -> float | None:
    """The timed steps' median as the record gives it (``step_time_s``: per step, the slowest
    rank's), so that the note and the terminal judge a slow start by the same step; None where
    the ranks timed nothing or not alike."""
    per_rank = [r.step_times for r in ok]
    if not per_rank or len({len(t) for t in per_rank}) != 1:
        return None
    return (summarize(slowest_rank(per_rank)) or {}).get("median")


def _note(
    cell: CellConfig, plan: WorldPlan, ok: list[RankResult], startup: dict[str, float | None] | None = None
) -> str:
    parts = [plan.note, slow_start(startup, _median_step(ok))]
    if cell.fake:
        parts.append(FAKE_NOTE)
        planned = ok[0].settings.get("planned") if ok else None
        if planned:
            parts.append(planned)
    return "; ".join(p for p in parts if p)
