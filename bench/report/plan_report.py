"""The plan as text: its terminal table (rich, at most 120 columns), ``plan.md`` and the
one-line verdict. Renders a ``bench/studies/plan.py`` ``Plan``; decides nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from shardbench.harness.config import CellConfig
from shardbench.report.tables import error_file, markdown_table
from shardbench.studies.plan import (
    FASTER_BY,
    LEVELS,
    UNPLANNED,
    Plan,
    PlanRow,
    measure_command,
    per_sample,
    why_faster,
    why_width,
)
from shardbench.studies.reference import REFERENCE
from shardbench.units import count_text, in_unit, params_text, seconds_text, size_unit
from shardbench.wording import first_sentence, wrap

MIB = 1 << 20
WIDTH = 120
#: the plan as data beside its records (``plan_json``): its HTML page leads with it
PLAN_JSON = "plan.json"


def _step(row: PlanRow) -> str:
    t = row.record.step_time_s or {}
    if not t.get("median"):
        return "-"
    text = f"{t['median'] * 1e3:.0f} ± {(t.get('mad') or 0) * 1e3:.0f} ms"
    if (verdict := row.step_vs_ddp) is not None:
        text += f" ({verdict.ratio:.2f}x, {verdict.note()})"
    return text


def _predicted(row: PlanRow) -> list[str]:
    """The predicted step, the tokens/s it would give per rank (a GPU on CUDA) and for the
    whole job, and its MFU (``bench/prediction/step_time.py``)."""
    p = row.predicted
    if not p:
        return ["-", "-", "-", "-"]
    tokens, mfu = p.tokens_per_s, p.mfu
    interval = ""
    if p.interval:  # the measured step's range around the prediction: "1.20 s -15/+19%"
        low, high = (100 * (bound / p.step - 1) for bound in p.interval)
        interval = f" {low:+.0f}/{high:+.0f}%"
    return [
        seconds_text(p.step) + interval,
        count_text(tokens / row.record.world_size) if tokens else "-",
        count_text(tokens) if tokens else "-",
        "-" if mfu is None else f"{mfu:.3g}" if mfu < 0.001 else f"{mfu:.1%}",
    ]


def tokens_headers(plan: Plan) -> list[str]:
    """The two tokens/s columns: per GPU (per rank on the CPU), as torchtitan, Megatron and
    llm-foundry report it, and the whole job's, all ranks together."""
    cuda = any(r.record.device == "cuda" for r in plan.rows if r.predicted)
    return [f"tokens/s/{'GPU' if cuda else 'rank'}", "tokens/s/job"]


def network_line(plan: Plan) -> str | None:
    """Which network profile, peak and update rate the predicted steps assumed, and the
    overlap rule; or why no step was predicted."""
    p = next((r.predicted for r in plan.rows if r.predicted), None)
    if p is None:
        why = next((r.not_predicted for r in plan.rows if r.not_predicted), None)
        hint = "; --gpu NAME names the GPU to predict for" if "no peak" in (why or "") else ""
        return why and f"{why}{hint}"
    update = p.seconds_per_update_element or 0
    share = p.core_share if p.core_share is not None else 1.0
    cores = f", x {share:.3g} core share (ranks outnumber cores)" if share < 1 else ""
    overlap = (
        "every collective exposed (it shares the compute's cores)"
        if p.shares_compute
        else "gradients under backward, unit gathers prefetched, post-step gathers exposed"
    )
    if p.efficiency is None:  # compute replayed op by op: no FLOP rate, no efficiency
        compute = "forward and backward replayed op by op on this CPU" + (
            f" / {share:.3g} core share (ranks outnumber cores)" if share < 1 else ""
        )
    else:
        compute = (
            f"FLOPs / ({(p.peak_flops_per_s or 0) / 1e12:.3g} TFLOP/s {p.peak_kind} peak "
            f"x {p.efficiency:g}{cores})"
        )
    return (
        f"predicted step = {compute} + optimizer update"
        + (f" ({update * 1e9:.3g} ns per element)" if update else " (not modelled: no memory bandwidth)")
        + f" + exposed communication over {p.network_source}; {overlap} (docs/measuring.md)"
    )


def _fits(row: PlanRow) -> str:
    if row.unplanned:
        return UNPLANNED
    if row.failed:
        return f"{row.record.status}: {first_sentence(row.record.error)}"
    return "yes" if row.fits else "no"


def plan_unit(plan: Plan) -> tuple[int, str]:
    """The unit of every size the plan prints: GiB where a strategy's peak, reserve or model
    states reach 1 GiB, else MiB (a small model's peaks in a 1 GiB budget read ``5.3``, not
    ``0.01``); the budget's where nothing was measured. The headroom is left out: it is the
    budget less the peak, and would choose GiB for every small model in a large budget."""
    figures = [
        f for r in plan.rows for f in (r.peak, r.reserve_bytes, r.model_states, r.formula) if f is not None
    ]
    return size_unit(max(figures, default=plan.budget))


def table(plan: Plan) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of the plan table, sizes in ``plan_unit``: the peak, the reserve
    kept beside it and the headroom after both; the model states held after a step beside the
    ZeRO formula's; the peak's activations and the rest; where a step was predicted, the step,
    tokens/s per GPU and for the whole job, and MFU (the headers stay short so that a
    strategy's name is never broken across lines in a 120-column terminal)."""
    unit, _ = plan_unit(plan)
    rows = plan.rows
    searched = any(r.max_batch is not None for r in rows)
    timed = any((r.record.step_time_s or {}).get("median") for r in rows)
    columns = [
        "strategy",
        "shards",
        "fits",
        "peak",
        "reserve",
        "headroom",
        "states",
        "formula",
        "activ",
        "other",
    ]
    columns += ["max batch"] if searched else []
    columns += [f"step time (vs {REFERENCE})"] if timed else []
    predicted = any(r.predicted for r in rows)
    columns += ["pred step", *tokens_headers(plan), "MFU"] if predicted else []
    out = []
    for r in rows:
        parts = r.record.mem_breakdown_bytes or {}
        other = None if r.unplanned or not parts else parts.get("other", 0) + parts.get("comm", 0)
        line = [r.label, LEVELS[r.level], _fits(r), in_unit(r.peak, unit), in_unit(r.reserve_bytes, unit)]
        line += [in_unit(r.headroom, unit), in_unit(r.model_states, unit), in_unit(r.formula, unit)]
        line += [
            in_unit(None if r.unplanned or not parts else parts.get("activations", 0), unit),
            in_unit(other, unit),
        ]
        line += ["-" if r.max_batch is None else str(r.max_batch)] if searched else []
        line += [_step(r)] if timed else []
        line += _predicted(r) if predicted else []
        out.append(line)
    return columns, out


def reserve_line(plan: Plan) -> str:
    """What the reserve is made of, where its figures come from and what it leaves out."""
    policy = plan.policy
    if policy.fixed is not None:
        unit, label = plan_unit(plan)
        return f"reserve: {in_unit(policy.fixed, unit)} {label} per rank beside each peak (--reserve)"
    if policy.device != "cuda":
        return "reserve: none (on the CPU nothing is held beside the tensors; --reserve SIZE sets one)"
    strategies = list(dict.fromkeys(r.strategy for r in plan.rows))  # once each, whatever its widths
    measured = [f"{s} {policy.ratios[s]:.4f}" for s in strategies if s in policy.ratios]
    unmeasured = [s for s in strategies if s not in policy.ratios]
    parts = [", ".join(measured)] if measured else []
    if unmeasured:
        parts.append(f"{', '.join(unmeasured)} not measured: the worst of all, {policy.worst:.4f}")
    ratios = "; ".join(parts)
    context = (
        "the CUDA context is not in it (not measured yet: add it with --reserve)"
        if policy.context is None
        else f"plus the CUDA context, {policy.context / MIB:.0f} MiB"
    )
    return (
        f"reserve: the allocator's cache at the worst reserved/allocated ratio {policy.source} ({ratios}); "
        f"{context}. Data: bench/suites/measured/cuda-reserve.toml, docs/measuring.md"
    )


def verdict(plan: Plan) -> str:
    """One line: the recommendation, the margin it kept and why, or why nothing fits."""
    unit, label = plan_unit(plan)
    budget = f"{in_unit(plan.budget, unit)} {label}"
    at = f"at batch {plan.batch} per rank" if plan.batch is not None else "at batch 1 per rank"
    best, failed, unplanned = plan.best, plan.failed, plan.unplanned
    failed_names = ", ".join(r.strategy for r in failed)
    broken = f" ({len(failed)} failed to run: {failed_names}; see the table)" if failed else ""
    if unplanned:
        broken += (
            f"; {UNPLANNED}: {', '.join(r.strategy for r in unplanned)}, measure with: "
            + measure_command(unplanned[0].record, [r.strategy for r in unplanned])
        )
    planned = [r for r in plan.rows if not r.unplanned]
    if best is None and not planned:
        return f"no plan: none of the strategies asked for can be planned{broken}"
    if best is None and len(failed) == len(planned):
        return f"no plan: every strategy failed to run ({failed_names}); see the table{broken}"
    if best is None:
        lowest = plan.lowest
        least = (
            f"; the lowest peak is {lowest.strategy}'s, {in_unit(lowest.peak, unit)} {label} "
            f"(+ reserve {in_unit(lowest.reserve_bytes, unit)})"
            if lowest
            else ""
        )
        return (
            f"nothing fits {at} in {budget} per rank{least}: try --activation-checkpointing, "
            f"--precision bf16, a smaller batch or more ranks{broken}"
        )
    least = plan.least
    if least is not None and best is not least:
        why = why_faster(best, least)
    elif best.predicted_step is not None:
        least_text = "the least sharding that fits" if best.level else "nothing needs sharding"
        why = least_text + _tie_text(plan, best)
    else:
        why = "the least sharding that fits" if best.level else "nothing needs sharding"
    batch_part = f", largest batch {best.max_batch}" if best.max_batch is not None else ""
    most = plan.largest_batch
    if most is not None and best.max_batch and most.max_batch and most.max_batch > best.max_batch:
        batch_part += f"; the largest batch of all is {most.strategy}'s, {most.max_batch}"
    return (
        f"recommended: {best.label} ({why}; peak {in_unit(best.peak, unit)} + reserve "
        f"{in_unit(best.reserve_bytes, unit)} of {budget}, {in_unit(best.headroom, unit)} {label} headroom "
        f"after the reserve{batch_part}){broken}"
    )


#: why a plan for CUDA made on the CPU can name a CPU attention kernel: the plan routes
#: attention to the fused kernel CUDA would pick, and where CUDA has none for the inputs (a head
#: over 256 wide, a dtype it does not fuse) the call runs as it came, on the CPU's kernel
CPU_ATTENTION_IN_A_CUDA_PLAN = (
    "attention marked (CPU) ran the CPU's kernel: CUDA has no fused kernel for these inputs and "
    "would run the math path, which keeps the score matrix, so the plan's activations may be low"
)


def kernels_line(plan: Plan) -> str | None:
    """Which optimizer implementation and attention kernel the plan's memory assumed, and why a
    plan for CUDA names a CPU kernel where it does."""
    planned_for, seen = plan.kernels()
    if not seen:
        return None
    parts = []
    for (optimizer, attention), strategies in seen.items():
        who = "" if len(seen) == 1 else f" ({', '.join(strategies)})"
        parts.append(f"optimizer {optimizer}, attention {attention}{who}")
    where = f" ({planned_for}, with its kernels)" if planned_for else ""
    line = "kernels assumed" + where + ": " + "; ".join(parts)
    cpu_kernel = any("(CPU)" in attention for _, attention in seen)
    if planned_for and planned_for.startswith("cuda") and cpu_kernel:
        line += f" ({CPU_ATTENTION_IN_A_CUDA_PLAN})"
    return line


def title(
    plan: Plan, cell: CellConfig, *, budget_text: str, gpu: str | None = None, gpu_implied: bool = False
) -> str:
    """What was planned: the model and Ψ, N and the device it is for (the GPU ``--gpu`` named,
    and that it chose CUDA where ``--device`` was not given), precision, budget, batch and how
    it was planned."""
    mode = "fake" if cell.fake else "simulated, real tensors"
    batch = "largest batch" if plan.batch is None else f"batch {plan.batch}"
    device = cell.device + (f" {gpu}" if gpu else "")
    device += " (--gpu implies --device cuda)" if gpu_implied else ""
    return (
        f"plan: {cell.workload} {cell.preset} (Ψ = {params_text(plan.params)} parameters), "
        f"N={cell.world_size} on {device}, {cell.precision}, budget {budget_text} per rank, {batch}"
        + (", AC" if cell.activation_checkpointing else "")
        + f" ({mode}); sizes in {plan_unit(plan)[1]}"
    )


def _tie_text(plan: Plan, best: PlanRow) -> str:
    """Why ``best`` stands where a fitting row is predicted faster per sample: the intervals
    of this machine's checks overlap (predicted equal), or none is ``FASTER_BY`` faster."""
    faster = [r for r in plan.rows if r.fits and r.predicted_step and per_sample(r) < per_sample(best)]
    if not faster:
        return ", and the fastest"
    with_intervals = all(r.predicted and r.predicted.interval for r in (best, *faster))
    if with_intervals:
        return (
            f", predicted equal to {', '.join(r.label for r in faster)} (their intervals from this "
            "machine's checks of the model overlap)"
        )
    return f", none predicted {FASTER_BY:.0%} faster"


def width_line(plan: Plan) -> str | None:
    """Why the recommendation shards as wide as it does, where it shards in groups: one line."""
    best = plan.best
    reason = why_width(best, plan.rows, plan.ranks_per_node) if best else None
    return f"shard width: {reason}" if reason else None


def plan_json(plan: Plan, *, title_text: str) -> dict[str, Any]:
    """The plan as data for other renderers (the HTML report): the budget, the reserve, the
    recommendation and each strategy's figures in bytes, with the lines the terminal prints."""
    best = plan.best
    columns, body = table(plan)
    return {
        "title": title_text,
        "budget_bytes": plan.budget,
        "kernels": kernels_line(plan),
        "columns": columns,
        "table": body,
        "batch": plan.batch,
        "params": plan.params,
        "recommended": best.label if best else None,
        "verdict": verdict(plan),
        "shard_width": width_line(plan),
        "reserve": reserve_line(plan),
        "network": network_line(plan),
        "least_sharding": plan.least.strategy if plan.least else None,
        "rows": [
            {
                "strategy": r.strategy,
                "shard_group": r.shard_width,
                "fits": r.fits,
                "status": r.record.status,
                "peak_bytes": r.peak,
                "reserve_bytes": r.reserve_bytes,
                "headroom_bytes": r.headroom,
                "model_state_bytes": r.model_states,
                "formula_bytes": r.formula,
                "max_batch": r.max_batch,
                "predicted_step_time": asdict(r.predicted) if r.predicted else None,
            }
            for r in plan.rows
        ],
    }


def plan_markdown(plan: Plan, *, title_text: str, charts: Sequence[str] = ()) -> str:
    """``plan.md``: the table (a failed row links its whole error, kept beside the records),
    the verdict, the reserve, the kernels assumed, and the charts written beside it."""
    columns, body = table(plan)
    fits = columns.index("fits")
    for row, line in zip(plan.rows, body, strict=True):
        if row.failed and (name := error_file(row.record)):
            line[fits] += f" ([traceback]({name}))"
    kernels = kernels_line(plan)
    tail = f"\n\n{kernels}" if kernels else ""
    lines = [f"# {title_text}", markdown_table(columns, body), verdict(plan)]
    lines += [w] if (w := width_line(plan)) else []
    lines += [reserve_line(plan)]
    lines += [n] if (n := network_line(plan)) else []
    lines += [f"![predicted step and peak per rank against the shard width]({name})" for name in charts]
    return "\n\n".join(lines) + f"{tail}\n"


#: the fits cell of a strategy that cannot be planned, in the terminal: ``UNPLANNED`` in full
#: would wrap its row over four lines at 120 columns; the verdict under the table names these
#: strategies with ``UNPLANNED`` and the command that measures them, and plan.md keeps it whole
UNPLANNED_SHORT = "unplanned"


#: headers the terminal prints on two lines, each no wider than the figures under it, where the
#: table would be wider than the terminal with them on one: a predicted plan's row (two tokens/s
#: columns beside the step and MFU) then stays within 120 columns
TERMINAL_HEADERS = {
    "headroom": "head\nroom",
    "pred step": "pred\nstep",
    "tokens/s/GPU": "tok/s\n/GPU",
    "tokens/s/rank": "tok/s\n/rank",
    "tokens/s/job": "tok/s\n/job",
}


def terminal_headers(columns: list[str]) -> list[str]:
    """``columns`` as the terminal prints them: ``TERMINAL_HEADERS`` where it has one, and the
    others on the last line beside them."""
    headers = [TERMINAL_HEADERS.get(c, c) for c in columns]
    lines = max(h.count("\n") for h in headers) + 1
    return ["\n" * (lines - 1 - h.count("\n")) + h for h in headers]


def print_plan(plan: Plan, *, title_text: str) -> None:
    """The plan table on the terminal (rich, at most 120 columns, a strategy's row on one line
    but for a failed cell's error; plain text without rich)."""
    columns, body = table(plan)
    fits = columns.index("fits")
    for row, line in zip(plan.rows, body, strict=True):
        if row.unplanned:
            line[fits] = UNPLANNED_SHORT
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(plan_markdown(plan, title_text=title_text))
        return

    def rich_table(headers: list[str]) -> Table:
        t = Table(header_style="bold", pad_edge=False, box=None)
        for i, c in enumerate(headers):
            left = i < 3
            t.add_column(c, justify="left" if left else "right", overflow="fold", no_wrap=i == 0 or not left)
        for line in body:
            t.add_row(*line)
        return t

    here = Console()
    width = min(WIDTH, here.width) if here.is_terminal else WIDTH
    console = Console(width=width)
    t = rich_table(columns)
    unbounded = console.options.update_width(1 << 16)  # its natural width, not one clamped to ours
    if console.measure(t, options=unbounded).maximum > width:
        t = rich_table(terminal_headers(columns))
    for line in wrap(title_text, width):  # above the table, wrapped here: rich would split words
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print(t)
    for text in (verdict(plan), width_line(plan), reserve_line(plan), network_line(plan), kernels_line(plan)):
        if text:
            for line in wrap(text, width):
                console.print(line, markup=False, highlight=False, soft_wrap=True)
