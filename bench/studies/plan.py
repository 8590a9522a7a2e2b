"""``shardbench plan``: will this model train on N ranks of a given memory, and how.

Every strategy is planned as an ordinary cell of one simulated rank (``--fake``: under
FakeTensorMode, nothing allocated, so a 1B model plans on a laptop; a workload whose shapes
depend on its data, which FakeTensorMode cannot follow, runs with real tensors instead), at the
given per-rank batch or, with ``--max-batch``, searched for the largest batch that fits
(``maxsize.search``, ``--vary batch``). Each strategy's answer is its per-rank peak, its
breakdown, its model states beside the ZeRO formula's, whether it fits and the headroom left.

A fit is judged against ``budget - reserve``: the reserve (``bench/studies/plan_reserve.py``)
is what a process needs beyond its tensors' peak (on CUDA the context and the allocator's
cache; 0 on the CPU), so a plan that fits is one that runs. ``--max-batch`` searches by the
same rule (``Reserve.fits``, as ``max-size`` does): the largest batch whose peak and reserve fit.

The recommendation is the *least sharding that fits* (with its reserve): sharding more than needed costs
communication (ZeRO-3 gathers the parameters twice a step) for memory the run does not need.
Strategies are ranked by what they shard (nothing; optimizer state; + gradients;
+ parameters); within a rank the one with the most headroom is recommended. A peer that cannot
be a simulated rank (DeepSpeed and FairScale run their own communication) keeps its row, marked
"measured only on real ranks", with the command that measures it; it is never recommended. Where cells ran for
real (not ``--fake``), their step time is set against ddp's with a run's speed verdict
(``pair_verdict``: one run's ratio is within its steps' noise or not judged); a simulated world
has no communication, so it is a compute-only time.

This module returns data (``Plan``, ``PlanRow``); ``bench/report/plan_report.py`` renders it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from shardbench.harness.config import CellConfig, make_cell
from shardbench.records import Record, strategy_label
from shardbench.step_figures import PredictedStep
from shardbench.step_figures import from_json as figures
from shardbench.studies.plan_reserve import Reserve, ReservePolicy
from shardbench.studies.reference import REFERENCE
from shardbench.studies.speed_verdict import SpeedVerdict, pair_verdict

#: every strategy a user would choose between, least sharding first
PLAN_STRATEGIES = (
    "ddp",
    "zero1",
    "torch-zero1",
    "fairscale-zero1",
    "deepspeed-zero1",
    "zero2",
    "fsdp2-zero2",
    "fairscale-zero2",
    "deepspeed-zero2",
    "zero3",
    "fsdp2-zero3",
    "fairscale-zero3",
    "deepspeed-zero3",
)
#: the fits column of a strategy that cannot be planned (a peer whose library runs its own
#: communication cannot be a simulated rank): it keeps its row, so it is never silently dropped
UNPLANNED = "measured only on real ranks"
#: what each sharding level adds, for the table
LEVELS = ("none", "optim", "+grads", "+params")


def sharding_level(strategy: str) -> int:
    """0 nothing sharded, 1 optimizer state, 2 + gradients, 3 + parameters."""
    from shardbench.strategies.registry import get_strategy

    s = get_strategy(strategy).sharding
    return int(s.optimizer_state or s.whole_parameters) + int(s.gradients) + int(s.parameters)


def planning_cells(
    *, strategies: Sequence[str] = PLAN_STRATEGIES, shard_widths: Sequence[int] = (), **fields: Any
) -> list[CellConfig]:
    """One cell per strategy of ``fields`` (CellConfig fields): one simulated rank, one warm-up
    and one measured step (memory is what a plan needs; the peak is reached within the first
    steps). A strategy that shards in groups (its card's ``shard_group``) gets a cell for each
    of ``shard_widths`` below the world size too, after its flat one."""
    from shardbench.strategies.registry import strategy_card

    planned = {"steps": 1, "warmup": 1, "suite": "plan", "simulate": True}
    cells = []
    for s in strategies:
        cell = make_cell(**{**fields, **planned, "strategy": s})
        cells.append(cell)
        if strategy_card(s).shard_group:
            cells += [replace(cell, shard_group=w) for w in shard_widths if w < cell.world_size]
    return cells


def shard_widths(world_size: int, ranks_per_node: int) -> list[int]:
    """The shard widths worth planning on nodes of G ranks: every S that divides N and is whole
    nodes (a multiple of G) or half a node (G/2, the narrowest that still halves what a node's
    ranks hold twice), from 2 up (S = 1 shards nothing): {G/2, G, 2G, ..., N}."""
    return [
        w
        for w in range(2, world_size + 1)
        if world_size % w == 0 and (w % ranks_per_node == 0 or 2 * w == ranks_per_node)
    ]


def plannable(strategy: str) -> bool:
    """Whether ``strategy`` can be a simulated rank (the card's ``simulatable``)."""
    from shardbench.strategies.registry import strategy_card

    return strategy_card(strategy).simulatable


def unplanned_record(cell: CellConfig, *, run_id: str) -> Record:
    """The plan's record of a strategy that cannot be planned: status "skipped", the predicted
    model states of its declared sharding, and in its note the command that measures it."""
    from shardbench.harness.result import cell_fields, predict, workload_params
    from shardbench.records import capture_env

    params = workload_params(cell)
    record = Record(
        **{**cell_fields(cell), "steps": 0, "warmup": 0},
        run_id=run_id,
        params=params,
        strategy=cell.strategy,
        world_size=cell.world_size,
        simulated=False,
        backend="none",
        status="skipped",
        predicted_mem_bytes=predict(cell, cell.world_size, params),
        env=capture_env(cell.device),
    )
    from shardbench.strategies.registry import strategy_card

    record.note = (
        f"{UNPLANNED}: {strategy_card(cell.strategy).not_simulatable_because}; "
        f"measure it with: {measure_command(record, [cell.strategy])}"
    )
    return record


def measure_command(record: Record, strategies: Sequence[str]) -> str:
    """The ``shardbench run`` that measures ``strategies`` on real ranks at ``record``'s cell;
    those that run only on CUDA at its precision (fairscale-zero3 always, FairScale's others at
    fp16) get a command of their own, with ``--device cuda``: the CPU would refuse them."""
    from shardbench.strategies.registry import cuda_only_at
    from shardbench.wording import program

    n = record.world_size
    flags = " --activation-checkpointing" if record.activation_checkpointing else ""
    cuda = [s for s in strategies if cuda_only_at(s, record.precision)]
    anywhere = [s for s in strategies if s not in cuda]

    def command(names: Sequence[str], device: str) -> str:
        return (
            f"{program()} run --workload {record.workload} --preset {record.preset} --strategy "
            f"{','.join(names)} --world-size {n} --precision {record.precision} --batch-size "
            f"{record.batch_size_per_rank}{flags}{device}"
        )

    commands = [command(anywhere, f" (on {n} real ranks: --device cuda for {n} GPUs)")] if anywhere else []
    commands += [command(cuda, f" --device cuda (on {n} GPUs)")] if cuda else []
    return "; and ".join(commands)


@dataclass(frozen=True)
class PlanRow:
    """One strategy's answer: the record of the cell planned (with ``--max-batch``: of the
    largest batch that fits, or of batch 1 when none does), and the reserve it must leave."""

    strategy: str
    record: Record
    budget: int
    max_batch: int | None = None  # None: not searched
    reserve: Reserve = Reserve()
    #: step time over ddp's and its speed verdict, where both ran and were timed
    step_vs_ddp: SpeedVerdict | None = None
    #: the step-time model's prediction (``bench/prediction/record_step_time.py``), or None and why
    predicted: PredictedStep | None = None
    not_predicted: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "predicted", figures(PredictedStep, self.predicted))

    @property
    def predicted_step(self) -> float | None:
        return self.predicted.step if self.predicted else None

    @property
    def level(self) -> int:
        return sharding_level(self.strategy)

    @property
    def label(self) -> str:
        """The strategy as the table names it: with its shard width where that is not N."""
        return strategy_label(self.record)

    @property
    def shard_width(self) -> int:
        """S: the ranks it shards over (N where it shards over all, or shards nothing)."""
        return self.record.shard_group or self.record.world_size

    @property
    def peak(self) -> int | None:
        return (self.record.peak_mem_bytes or {}).get("max")

    @property
    def unplanned(self) -> bool:
        """A strategy that cannot be planned (``UNPLANNED``): no cell ran."""
        return self.record.status == "skipped"

    @property
    def failed(self) -> bool:
        """The cell (or search) ended in an error or a timeout: neither a fit nor a non-fit."""
        return self.record.status not in ("ok", "oom", "skipped")

    @property
    def reserve_bytes(self) -> int | None:
        """What this strategy's peak needs beside it (``plan_reserve``)."""
        return None if self.peak is None else self.reserve.of(self.peak)

    @property
    def fits(self) -> bool:
        """The peak and its reserve are within the budget (``--max-batch``: the search, run
        against the budget less the reserve, found a batch)."""
        if self.failed or self.unplanned:
            return False
        if self.max_batch is not None:
            return self.max_batch >= 1
        return (
            self.record.status == "ok" and self.peak is not None and self.reserve.fits(self.peak, self.budget)
        )

    @property
    def headroom(self) -> int | None:
        """What is left of the budget after the peak and its reserve (only where it fits)."""
        if self.peak is None or not self.fits:
            return None
        return self.budget - self.peak - self.reserve.of(self.peak)

    @property
    def model_states(self) -> int | None:
        """Parameters, gradients and optimizer state held after a step, as measured."""
        held = self.record.model_state_bytes or {}
        return None if self.unplanned else held.get("total")

    @property
    def formula(self) -> int | None:
        """The same, as the ZeRO formula predicts it (``bench/metrics/analytic.py``)."""
        return (self.record.predicted_mem_bytes or {}).get("total")


@dataclass(frozen=True)
class Plan:
    """The whole answer: every strategy's row, the budget, the reserves and the recommendation."""

    rows: tuple[PlanRow, ...]
    budget: int
    policy: ReservePolicy
    #: the per-rank batch planned; None with ``--max-batch``
    batch: int | None
    #: the ranks a node holds, where the plan knows the cluster's shape (its shard widths)
    ranks_per_node: int | None = None

    @property
    def best(self) -> PlanRow | None:
        """The fastest predicted strategy that fits; the least sharding where none is predicted."""
        return fastest(self.rows) or recommend(self.rows)

    @property
    def least(self) -> PlanRow | None:
        """The least sharding that fits (``recommend``)."""
        return recommend(self.rows)

    @property
    def params(self) -> int | None:
        """Ψ: the model's parameter count (every row plans the same model)."""
        return next((r.record.params for r in self.rows if r.record.params), None)

    @property
    def failed(self) -> list[PlanRow]:
        return [r for r in self.rows if r.failed]

    @property
    def unplanned(self) -> list[PlanRow]:
        return [r for r in self.rows if r.unplanned]

    @property
    def lowest(self) -> PlanRow | None:
        """The lowest peak measured (what comes closest when nothing fits)."""
        measured = [r for r in self.rows if r.peak is not None and not r.failed and not r.unplanned]
        return min(measured, key=lambda r: r.peak or 0, default=None)

    @property
    def largest_batch(self) -> PlanRow | None:
        return max((r for r in self.rows if r.max_batch), key=lambda r: r.max_batch or 0, default=None)

    def kernels(self) -> tuple[str | None, dict[tuple[str, str], list[str]]]:
        """Where the plan's kernels were chosen for (``planned_for``) and which optimizer and
        attention kernels the records say each strategy assumed (``bench/metrics/kernels.py``)."""
        seen: dict[tuple[str, str], list[str]] = {}
        planned_for = None
        for r in self.rows:
            settings = r.record.strategy_settings or {}
            if k := settings.get("kernels"):
                seen.setdefault((k.get("optimizer", "?"), k.get("attention", "?")), []).append(r.strategy)
            planned_for = planned_for or settings.get("planned_for")
        return planned_for, seen


def rows_from(
    records: Sequence[Record], budget: int, *, max_batch: bool, policy: ReservePolicy | None = None
) -> list[PlanRow]:
    """The plan's rows from a plan run's records, in ``PLAN_STRATEGIES`` order, each with its
    reserve (none without a ``policy``) and its step time against ddp's where both ran."""
    policy = policy or ReservePolicy(device="cpu")
    rows = []
    for r in records:
        reserve = policy.of(r.strategy)
        if r.status == "skipped" and r.suite == "plan":
            rows.append(PlanRow(r.strategy, r, budget, reserve=reserve))
        elif max_batch and r.suite == "max-size" and r.max_size:
            fit = r.max_size.get("largest_fit")
            batch = fit["batch_size"] if fit else 0
            rows.append(PlanRow(r.strategy, r, budget, max_batch=batch, reserve=reserve))
        elif not max_batch and r.suite == "plan":
            rows.append(PlanRow(r.strategy, r, budget, reserve=reserve))
    order = {s: i for i, s in enumerate(PLAN_STRATEGIES)}
    rows.sort(key=lambda row: order.get(row.strategy, len(order)))
    base = next((r for r in rows if r.strategy == REFERENCE and r.record.status == "ok"), None)
    return [replace(r, step_vs_ddp=_against(r, base)) for r in rows]


def _against(row: PlanRow, base: PlanRow | None) -> SpeedVerdict | None:
    if base is None or base is row:
        return None
    return pair_verdict(row.record, base.record)


#: where this machine has no intervals for the predictions, how much faster per sample a
#: strategy must be predicted than the least sharding that fits to be recommended over it:
#: closer than this the two are a tie, which the least sharding wins, as the model's own error
#: on the CPU is larger (docs/measuring.md, "Predicted step time")
FASTER_BY = 0.10


def per_sample(row: PlanRow) -> float:
    """The row's predicted step over its batch (with --max-batch each strategy's is its own)."""
    return (row.predicted_step or 0.0) / max(1, row.record.batch_size_per_rank)


def predicted_equal(a: PlanRow, b: PlanRow) -> bool:
    """Whether ``a`` cannot be called faster than ``b``: their intervals (this machine's checks
    of the model, ``prediction/model_error.py``) overlap per sample, or, without intervals, ``a``
    is not predicted ``FASTER_BY`` faster per sample."""
    from shardbench.prediction.model_error import overlap

    ia, ib = a.predicted.interval if a.predicted else None, b.predicted.interval if b.predicted else None
    if ia is not None and ib is not None:
        sa, sb = max(1, a.record.batch_size_per_rank), max(1, b.record.batch_size_per_rank)
        return overlap([t / sa for t in ia], [t / sb for t in ib])
    return not per_sample(a) < (1 - FASTER_BY) * per_sample(b)


def fastest(rows: Sequence[PlanRow]) -> PlanRow | None:
    """The fitting strategy that trains fastest by prediction: the least predicted time per
    sample (its step over its batch), where it is not predicted equal to the least sharding that
    fits (``predicted_equal``); otherwise the least sharding."""
    timed = [r for r in rows if r.fits and r.predicted_step is not None]
    best = min(timed, key=lambda r: (per_sample(r), r.level, -(r.headroom or 0)), default=None)
    if best is not None and (flat := _flat_of(best, timed)) is not None:
        # a narrower shard group holds more per rank: it must beat its own strategy over all N
        # by the same rule, or the flat one stands
        best = flat if predicted_equal(best, flat) else best
    least = recommend(rows)
    if best is None or least is None or least.predicted_step is None:
        return best
    return least if predicted_equal(best, least) else best


def _flat_of(row: PlanRow, rows: Sequence[PlanRow]) -> PlanRow | None:
    """The row of ``row``'s strategy sharded over all N, where ``row`` shards in smaller groups."""
    n = row.record.world_size
    if row.shard_width == n:
        return None
    return next((r for r in rows if r.strategy == row.strategy and r.shard_width == n), None)


def why_faster(fast: PlanRow, least: PlanRow) -> str:
    """Why the fastest strategy beats the least sharding one: the predicted terms that differ."""
    from shardbench.units import seconds_text

    a, b = fast.predicted, least.predicted
    assert a is not None and b is not None, "only predicted rows are compared"
    names = {
        "compute": "compute",
        "update": "optimizer update",
        "exposed_comm": "exposed communication",
        "call_overhead": "collective calls' in-step overhead",
        "buffer_memory": "communication buffers' copies and fresh memory",
    }
    differ = {k: (getattr(a, k) or 0) - (getattr(b, k) or 0) for k in names}
    terms = [
        f"{seconds_text(abs(differ[k]))} {'less' if differ[k] < 0 else 'more'} {label}"
        for k, label in names.items()
        if abs(differ[k]) > 1e-3 * b.step
    ]
    ba, bb = fast.record.batch_size_per_rank, least.record.batch_size_per_rank
    batches = f" (batch {ba} against {bb}: per sample, faster)" if ba != bb else ""
    return (
        f"{fast.label} is predicted faster than {least.label}, the least sharding that fits "
        f"({seconds_text(a.step)} against {seconds_text(b.step)} per step{batches}: {', '.join(terms)})"
    )


def recommend(rows: Sequence[PlanRow]) -> PlanRow | None:
    """The least sharding that fits with its reserve; within it, the most headroom."""
    fitting = [r for r in rows if r.fits]
    if not fitting:
        return None
    return min(fitting, key=lambda r: (r.level, -(r.headroom or 0)))


def why_width(best: PlanRow, rows: Sequence[PlanRow], ranks_per_node: int | None) -> str | None:
    """Why ``best``'s shard width: where its shard group lies on the nodes, and its predicted
    step and memory against the same strategy sharded over all N. None where it shards over all
    N, or that row was not predicted."""
    from shardbench.units import size_text

    n = best.record.world_size
    flat = next((r for r in rows if r.strategy == best.strategy and r.shard_width == n), None)
    if best.shard_width == n or flat is None or not flat.predicted_step or not best.predicted_step:
        return None
    if ranks_per_node and best.shard_width <= ranks_per_node:
        where = "every gather and reduce-scatter stays in the node"
    elif ranks_per_node:
        where = f"its shard group spans {best.shard_width // ranks_per_node} nodes, not {n // ranks_per_node}"
    else:
        where = f"its shard group is {best.shard_width} ranks, not {n}"
    speed = flat.predicted_step / best.predicted_step
    more = (best.peak or 0) - (flat.peak or 0)
    cost = f"for {size_text(more)} more per rank" if more > 0 else f"and {size_text(-more)} less per rank"
    return f"{best.label}: {where}; predicted {speed:.2f}x as fast as {flat.strategy} S={n} {cost}"
