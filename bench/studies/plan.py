"""``shardbench plan``: will this model train on N ranks of a given memory, and how.

Every strategy is planned as an ordinary cell of one simulated rank (``--fake``: under
FakeTensorMode, nothing allocated, so a 1B model plans on a laptop; a workload whose shapes
depend on its data, which FakeTensorMode cannot follow, runs with real tensors instead), at the
given per-rank batch or, with ``--max-batch``, searched for the largest batch that fits
(``maxsize.search``, ``--vary batch``). The table gives each strategy's per-rank peak, its
breakdown, whether it fits the budget and the headroom left.

The recommendation is the *least sharding that fits*: sharding more than needed costs
communication (ZeRO-3 gathers the parameters twice a step) for memory the run does not need.
Strategies are ranked by what they shard (nothing; optimizer state; + gradients;
+ parameters); within a rank the one with the most headroom is recommended. A peer that cannot
be a simulated rank (DeepSpeed and FairScale run their own communication) keeps its row, marked
"measured only on real ranks", with the command that measures it; it is never recommended. Where cells ran for
real (not ``--fake``), their step time is shown against ddp's with the noise rule ``compare``
uses; a simulated world has no communication, so it is a compute-only time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardbench.harness.config import CellConfig
from shardbench.records import Record, first_line
from shardbench.report.tables import markdown_table
from shardbench.studies.compare_rules import step_time_noise

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
#: the plan's summary beside its records (``plan_summary``): its HTML page leads with it
PLAN_JSON = "plan.json"
GIB, MIB = 1 << 30, 1 << 20


def sharding_level(strategy: str) -> int:
    """0 nothing sharded, 1 optimizer state, 2 + gradients, 3 + parameters."""
    from shardbench.strategies.registry import get_strategy

    s = get_strategy(strategy).sharding
    return int(s.optimizer_state or s.whole_parameters) + int(s.gradients) + int(s.parameters)


def planning_cells(
    *,
    workload: str,
    preset: str,
    world_size: int,
    precision: str,
    batch_size: int,
    activation_checkpointing: bool,
    device: str,
    fake: bool,
    timeout_s: float,
    strategies: Sequence[str] = PLAN_STRATEGIES,
) -> list[CellConfig]:
    """One cell per strategy: one simulated rank, one warm-up and one measured step (memory is
    what a plan needs; the peak is reached within the first steps)."""
    return [
        CellConfig(
            workload=workload,
            preset=preset,
            strategy=s,
            world_size=world_size,
            precision=precision,
            batch_size=batch_size,
            steps=1,
            warmup=1,
            device=device,
            timeout_s=timeout_s,
            suite="plan",
            simulate=True,
            fake=fake,
            activation_checkpointing=activation_checkpointing,
        )
        for s in strategies
    ]


def plannable(strategy: str) -> bool:
    """Whether ``strategy`` can be a simulated rank (the card's ``simulatable``)."""
    from shardbench.strategies.registry import strategy_card

    return strategy_card(strategy).simulatable


def unplanned_record(cell: CellConfig, *, run_id: str) -> Record:
    """The plan's record of a strategy that cannot be planned: status "skipped", the predicted
    model states of its declared sharding, and in its note the command that measures it."""
    from shardbench.harness.prediction import predict, workload_params
    from shardbench.harness.result import cell_fields
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
    those that run only on CUDA get a command of their own, with ``--device cuda``."""
    from shardbench.strategies.registry import strategy_card

    n = record.world_size
    flags = " --activation-checkpointing" if record.activation_checkpointing else ""
    cuda = [s for s in strategies if strategy_card(s).cuda_only]
    anywhere = [s for s in strategies if s not in cuda]

    def command(names: Sequence[str], device: str) -> str:
        return (
            f"shardbench run --workload {record.workload} --preset {record.preset} --strategy "
            f"{','.join(names)} --world-size {n} --precision {record.precision} --batch-size "
            f"{record.batch_size_per_rank}{flags}{device}"
        )

    commands = [command(anywhere, f" (on {n} real ranks: --device cuda for {n} GPUs)")] if anywhere else []
    commands += [command(cuda, f" --device cuda (on {n} GPUs)")] if cuda else []
    return "; and ".join(commands)


@dataclass(frozen=True)
class PlanRow:
    """One strategy's answer: the record of the cell planned (with ``--max-batch``: of the
    largest batch that fits, or of batch 1 when none does)."""

    strategy: str
    record: Record
    budget: int
    max_batch: int | None = None  # None: not searched

    @property
    def level(self) -> int:
        return sharding_level(self.strategy)

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
    def fits(self) -> bool:
        if self.failed or self.unplanned:
            return False
        if self.max_batch is not None:
            return self.max_batch >= 1
        return self.record.status == "ok" and self.peak is not None and self.peak <= self.budget

    @property
    def headroom(self) -> int | None:
        return None if self.peak is None or not self.fits else self.budget - self.peak


def rows_from(records: Sequence[Record], budget: int, *, max_batch: bool) -> list[PlanRow]:
    """The plan's rows from a plan run's records, in ``PLAN_STRATEGIES`` order."""
    rows = []
    for r in records:
        if r.status == "skipped" and r.suite == "plan":
            rows.append(PlanRow(r.strategy, r, budget))
        elif max_batch and r.suite == "max-size" and r.max_size:
            fit = r.max_size.get("largest_fit")
            rows.append(PlanRow(r.strategy, r, budget, max_batch=fit["batch_size"] if fit else 0))
        elif not max_batch and r.suite == "plan":
            rows.append(PlanRow(r.strategy, r, budget))
    order = {s: i for i, s in enumerate(PLAN_STRATEGIES)}
    return sorted(rows, key=lambda row: order.get(row.strategy, len(order)))


def recommend(rows: Sequence[PlanRow]) -> PlanRow | None:
    """The least sharding that fits; within it, the most headroom."""
    fitting = [r for r in rows if r.fits]
    if not fitting:
        return None
    return min(fitting, key=lambda r: (r.level, -(r.headroom or 0)))


def _size(nbytes: int | None, unit: int) -> str:
    return "-" if nbytes is None else f"{nbytes / unit:.2f}" if unit == GIB else f"{nbytes / unit:.1f}"


def _step(row: PlanRow, base: PlanRow | None) -> str:
    t = row.record.step_time_s or {}
    if not t.get("median"):
        return "-"
    text = f"{t['median'] * 1e3:.0f} ± {(t.get('mad') or 0) * 1e3:.0f} ms"
    if base is not None and base is not row and (b := base.record.step_time_s or {}).get("median"):
        noise = step_time_noise(row.record, base.record, base_label="ddp")
        text += f" ({t['median'] / b['median']:.2f}x{', within noise' if noise == 'within noise' else ''})"
    return text


def table(rows: Sequence[PlanRow], budget: int) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of the plan table (sizes in ``size_unit(budget)``: the headers stay short
    so that a strategy's name is never broken across lines in a 120-column terminal)."""
    unit, _ = size_unit(budget)
    searched = any(r.max_batch is not None for r in rows)
    timed = any((r.record.step_time_s or {}).get("median") for r in rows)
    base = next((r for r in rows if r.strategy == "ddp" and r.record.status == "ok"), None)
    columns = ["strategy", "shards", "peak", "params", "grads", "optim", "activ", "comm", "other"]
    columns += ["fits", "headroom"] + (["max batch"] if searched else [])
    columns += ["step time (vs ddp)"] if timed else []
    out = []
    for r in rows:
        parts = r.record.mem_breakdown_bytes or {}
        if r.unplanned:
            fits = UNPLANNED
        elif r.failed:
            fits = f"{r.record.status}: {first_line(r.record.error, 40)}"
        else:
            fits = "yes" if r.fits else "no"
        line = [r.strategy, LEVELS[r.level], _size(r.peak, unit)]
        line += [
            _size(None if r.unplanned else parts.get(c, 0), unit)
            for c in ("params", "grads", "optimizer", "activations", "comm", "other")
        ]
        line += [fits, _size(r.headroom, unit)] + ([str(r.max_batch)] if searched else [])
        line += [_step(r, base)] if timed else []
        out.append(line)
    return columns, out


def size_unit(budget: int) -> tuple[int, str]:
    """GiB, or MiB under a 1 GiB budget: the unit of every size in the plan table."""
    return (GIB, "GiB") if budget >= GIB else (MIB, "MiB")


def verdict(rows: Sequence[PlanRow], budget: int, *, batch: int | None) -> str:
    """One line: the recommendation and why, or why nothing fits."""
    unit, label = size_unit(budget)
    at = f"at batch {batch} per rank" if batch is not None else "at batch 1 per rank"
    best = recommend(rows)
    failed = [r.strategy for r in rows if r.failed]
    broken = f" ({len(failed)} failed to run: {', '.join(failed)}; see the table)" if failed else ""
    unplanned = [r for r in rows if r.unplanned]
    if unplanned:
        broken += (
            f"; {UNPLANNED}: {', '.join(r.strategy for r in unplanned)}, measure with: "
            + measure_command(unplanned[0].record, [r.strategy for r in unplanned])
        )
    planned = [r for r in rows if not r.unplanned]
    if best is None and not planned:
        return f"no plan: none of the strategies asked for can be planned{broken}"
    if best is None and len(failed) == len(planned):
        return f"no plan: every strategy failed to run ({', '.join(failed)}); see the table{broken}"
    if best is None:
        measured = [r for r in rows if r.peak is not None and not r.failed]
        lowest = min(measured, key=lambda r: r.peak or 0, default=None)
        least = (
            f"; the lowest peak is {lowest.strategy}'s, {_size(lowest.peak, unit)} {label}" if lowest else ""
        )
        return (
            f"nothing fits {at} in {_size(budget, unit)} {label} per rank{least}: try "
            f"--activation-checkpointing, --precision bf16, a smaller batch or more ranks{broken}"
        )
    why = "the least sharding that fits" if best.level else "nothing needs sharding"
    batch_part = f", largest batch {best.max_batch}" if best.max_batch is not None else ""
    most = max((r for r in rows if r.max_batch), key=lambda r: r.max_batch or 0, default=None)
    if most is not None and best.max_batch and most.max_batch and most.max_batch > best.max_batch:
        batch_part += f"; the largest batch of all is {most.strategy}'s, {most.max_batch}"
    return (
        f"recommended: {best.strategy} ({why}; peak {_size(best.peak, unit)} of {_size(budget, unit)} "
        f"{label}, {_size(best.headroom, unit)} {label} headroom{batch_part}){broken}"
    )


def kernels_line(rows: Sequence[PlanRow]) -> str | None:
    """Which optimizer implementation and attention kernel the plan's memory assumed, as the
    records say (``bench/metrics/kernels.py``), and the device whose kernels they are."""
    seen: dict[tuple[str, str], list[str]] = {}
    planned_for = None
    for r in rows:
        settings = r.record.strategy_settings or {}
        k = settings.get("kernels")
        if k:
            seen.setdefault((k.get("optimizer", "?"), k.get("attention", "?")), []).append(r.strategy)
        planned_for = planned_for or settings.get("planned_for")
    if not seen:
        return None
    parts = []
    for (optimizer, attention), strategies in seen.items():
        who = "" if len(seen) == 1 else f" ({', '.join(strategies)})"
        parts.append(f"optimizer {optimizer}, attention {attention}{who}")
    where = f" ({planned_for}, with its kernels)" if planned_for else ""
    return "kernels assumed" + where + ": " + "; ".join(parts)


def _with_unit(title: str, budget: int) -> str:
    return f"{title} (sizes in {size_unit(budget)[1]})"


def plan_markdown(rows: Sequence[PlanRow], budget: int, *, title: str, batch: int | None) -> str:
    columns, body = table(rows, budget)
    head = _with_unit(title, budget)
    kernels = kernels_line(rows)
    tail = f"\n\n{kernels}" if kernels else ""
    return f"# {head}\n\n{markdown_table(columns, body)}\n\n{verdict(rows, budget, batch=batch)}{tail}\n"


def plan_summary(
    rows: Sequence[PlanRow], budget: int, *, title: str, batch: int | None, reserve: int | None = None
) -> dict[str, Any]:
    """The plan as data for its page (``plan.json`` beside the records, which the HTML report
    leads with): the budget, the reserve kept below it (None: none), the recommendation and
    the table, as ``plan.md`` has them."""
    columns, body = table(rows, budget)
    best = recommend(rows)
    return {
        "title": _with_unit(title, budget),
        "budget_bytes": budget,
        "reserve_bytes": reserve,
        "recommended": None if best is None else best.strategy,
        "verdict": verdict(rows, budget, batch=batch),
        "columns": columns,
        "rows": body,
        "kernels": kernels_line(rows),
    }


def print_plan(rows: Sequence[PlanRow], budget: int, *, title: str, batch: int | None) -> None:
    """The plan table on the terminal (rich, at most 120 columns; plain text without rich)."""
    columns, body = table(rows, budget)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(plan_markdown(rows, budget, title=title, batch=batch))
        return
    t = Table(header_style="bold", pad_edge=False, box=None)
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i < 2 or c == "fits" else "right", overflow="fold", no_wrap=i == 0)
    for line in body:
        t.add_row(*line)
    here = Console()
    console = Console(width=min(120, here.width) if here.is_terminal else 120)
    console.print(_with_unit(title, budget))  # above the table: a table's title wraps at its width
    console.print(t)
    console.print(verdict(rows, budget, batch=batch))
    if kernels := kernels_line(rows):
        console.print(kernels)
