"""Tables from records: one row per cell, written as Markdown and CSV (pandas).

Only records go in, so a table can be rebuilt from any ``records.jsonl`` at any time. Failed
cells stay in the table with their status; they are never dropped.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from shardbench.paths import path_component
from shardbench.records import Record, flat_as_none, oversubscription, placement_of
from shardbench.studies.versus import model_states
from shardbench.wording import first_sentence

if TYPE_CHECKING:
    from shardbench.studies.exposed_comm import Exposed
    from shardbench.studies.scaling import Scaling

MIB = 2**20


def _mib(nbytes: int | None) -> float | None:
    return None if nbytes is None else nbytes / MIB


#: the columns of FLOPs and utilisation, shown once any record counted its FLOPs
THROUGHPUT_COLUMNS = (
    "tokens_per_s_per_rank",
    "tokens_per_s_job",
    "model_GFLOP_per_step",
    "hw_GFLOP_per_step",
    "TFLOP_s_per_rank",
    "MFU",
    "HFU",
    "peak_TFLOP_s",
    "peak_kind",
)


#: the columns of scaling efficiency, shown once any record has one
SCALING_COLUMNS = ("scaling_efficiency", "scaling_note")


def _giga(flops: float | None) -> float | None:
    return None if flops is None else flops / 1e9


def _tera(flops: float | None) -> float | None:
    return None if flops is None else flops / 1e12


def records_to_frame(records: Sequence[Record], *, tracebacks: bool = False) -> pd.DataFrame:
    """Flatten records into one row per cell (memory in MiB, time in ms): the peak's breakdown
    (``params_MiB`` ... ``other_MiB``) and the model states held after the step (``held_*``).

    Merged runs get a leading ``run_id`` column (two runs may measure the same cell; the row must
    say which); a ``repeat`` column once any cell was repeated (``run --repeat``: which repeat a
    row is, from 0); a ``fake`` column appears once any record was planned under FakeTensorMode, and
    an ``AC`` column once any record ran with activation checkpointing (its activations are
    recomputed, so its memory and time are not the plain cell's), an ``oversubscribed`` column
    once any cell's ranks outnumbered the cores they ran on (its step time is not judged),
    ``peer_estimate_MiB`` once any record carries a peer's own estimate of its model states
    (DeepSpeed's estimators), the scaling efficiency and its note (its flags, or why a cell has
    none) once any record has its N=1 cell in its run, and the throughput columns (tokens/s per
    rank and for the whole job, FLOPs per step, TFLOP/s per rank, MFU, HFU, the peak and its
    kind) once any record counted its FLOPs.
    With ``tracebacks`` (a table written beside its ``errors/``), a ``traceback`` column once any
    cell failed: the file that holds its whole error.
    """
    from shardbench.report.chart_types import reading_order
    from shardbench.studies.exposed_comm import exposed_comm
    from shardbench.studies.scaling import record_scaling

    records = sorted(records, key=reading_order)
    exposed = exposed_comm(records)  # the charts' order: one order for legend and rows
    scaled = record_scaling(records)
    rows = []
    several_runs = len({r.run_id for r in records}) > 1
    optional = {
        "fake": any(r.fake for r in records),
        "AC": any(r.activation_checkpointing for r in records),
        "repeat": any(r.repeat for r in records),
        "shard_group": any(flat_as_none(r.shard_group, r.world_size) for r in records),
        "traceback": tracebacks and any(error_file(r) for r in records),
        "oversubscribed": any(oversubscription(r) for r in records),
        "peer_estimate_MiB": any(_peer_estimate(r) for r in records),
        "model_state_vs_peer_estimate": any(_peer_estimate(r) for r in records),
        **dict.fromkeys(THROUGHPUT_COLUMNS, any(r.flops_per_step for r in records)),
        **dict.fromkeys(SCALING_COLUMNS, any(s.efficiency is not None for s in scaled.values())),
        **dict.fromkeys(("pred_step_ms", "pred_vs_meas"), any(r.predicted_step_time for r in records)),
    }
    for r in records:
        row: dict[str, object] = {"run_id": r.run_id} if several_runs else {}
        row.update(_cell_columns(r))
        row.update(_time_columns(r, scaled))
        row.update(_throughput_columns(r))
        row.update(_memory_columns(r, exposed))
        rows.append(row)
    frame = pd.DataFrame(rows)
    unused = [column for column, shown in optional.items() if not shown]
    return frame if frame.empty else frame.drop(columns=unused)


def _cell_columns(r: Record) -> dict[str, object]:
    """Which cell a row is, and how it ran."""
    return {
        "workload": r.workload,
        "preset": r.preset,
        "params_M": r.params / 1e6,
        "strategy": r.strategy,
        "shard_group": flat_as_none(r.shard_group, r.world_size),
        "repeat": r.repeat,
        "world_size": r.world_size,
        "simulated": r.simulated,
        "fake": r.fake,
        "AC": r.activation_checkpointing,
        "precision": r.precision,
        "batch_per_rank": r.batch_size_per_rank,
        "status": r.status,
        # its ranks waited for a core: its step time is not judged (studies.speed_verdict)
        "oversubscribed": oversubscribed(r),
    }


def _time_columns(r: Record, scaled: dict[int, Scaling]) -> dict[str, object]:
    """The step time, the step-time model's prediction beside it, samples and tokens per
    second, and the scaling efficiency."""
    from shardbench.prediction.accuracy import predicted_over_measured

    t = r.step_time_s or {}
    return {
        "step_ms": t.get("median", float("nan")) * 1e3 if t else None,
        "step_mad_ms": t.get("mad", float("nan")) * 1e3 if t else None,
        # the step-time model's (bench/prediction/step_time.py) and its ratio to the median
        "pred_step_ms": r.predicted_step_time.step * 1e3 if r.predicted_step_time else None,
        "pred_vs_meas": predicted_over_measured(r),
        "samples_per_s": r.samples_per_s,
        # per rank (a GPU on CUDA), as torchtitan, Megatron and llm-foundry report it,
        # and all ranks together, as samples_per_s
        "tokens_per_s_per_rank": r.tokens_per_s / r.world_size if r.tokens_per_s and r.world_size else None,
        "tokens_per_s_job": r.tokens_per_s,
        # per-rank samples/s over ddp's N=1 cell of the run and repeat
        # (bench/studies/scaling.py), or why there is none, and what to read it with
        "scaling_efficiency": (s := scaled.get(id(r))) and s.efficiency,
        "scaling_note": None if s is None else s.why or "; ".join(s.flags),
    }


def _throughput_columns(r: Record) -> dict[str, object]:
    """One rank's step in FLOPs and what it achieved against the device's peak."""
    return {
        # one rank's step, forward and backward (bench/prediction/flops.py), and what the
        # rank achieved against the device's peak (bench/prediction/peaks.py)
        "model_GFLOP_per_step": _giga(r.flops_per_step and r.flops_per_step.model),
        "hw_GFLOP_per_step": _giga(r.flops_per_step and r.flops_per_step.hardware),
        "TFLOP_s_per_rank": _tera((r.achieved_flops_per_s or {}).get("model")),
        "MFU": r.mfu,
        "HFU": r.hfu,
        "peak_TFLOP_s": _tera((r.peak_flops_per_s or {}).get("flops_per_s")),
        "peak_kind": (r.peak_flops_per_s or {}).get("kind"),
    }


def _memory_columns(r: Record, exposed: dict[int, Exposed]) -> dict[str, object]:
    """The peak and its breakdown, the model states held after the step, communication, and
    each beside what was predicted of it."""
    bd = r.mem_breakdown_bytes or {}
    held = r.model_state_bytes or {}
    model_state = model_states(r)
    predicted = (r.predicted_mem_bytes or {}).get("total")
    return {
        "peak_MiB": _mib((r.peak_mem_bytes or {}).get("max")),
        "params_MiB": _mib(bd.get("params")),
        "grads_MiB": _mib(bd.get("grads")),
        "optim_MiB": _mib(bd.get("optimizer")),
        "activ_MiB": _mib(bd.get("activations")),
        "comm_MiB": _mib(bd.get("comm")),
        "other_MiB": _mib(bd.get("other")),
        # the model states held after the step, beside the peak's: where zero2's gradient
        # shards are (they do not exist yet at its forward peak)
        "held_params_MiB": _mib(held.get("params")),
        "held_grads_MiB": _mib(held.get("grads")),
        "held_optim_MiB": _mib(held.get("optimizer")),
        # bytes a ring sends per rank in one steady step (bench/metrics/comm.py)
        "comm_sent_MiB": _mib(sent := (r.comm_per_step or {}).get("sent_per_rank")),
        # ZeRO's accounting for the same step (bench/metrics/analytic.py) and the ratio
        "pred_comm_MiB": _mib(sent_pred := (r.predicted_comm or {}).get("sent_per_rank")),
        "comm_vs_pred": sent / sent_pred if sent is not None and sent_pred else None,
        # the share of the real step communication added (bench/studies/exposed_comm.py)
        "exposed_comm": exposed[id(r)].fraction if id(r) in exposed else None,
        "exposed_comm_trace": (r.comm_overlap or {}).get("exposed_fraction"),
        "pred_model_state_MiB": _mib(predicted),
        "model_state_vs_pred": (model_state / predicted) if model_state and predicted else None,
        # a peer's own estimate of the same model states (DeepSpeed's estimators)
        "peer_estimate_MiB": _mib(estimate := _peer_estimate(r)),
        "model_state_vs_peer_estimate": (model_state / estimate) if model_state and estimate else None,
        "note": _note(r),
        # the failed cell's whole error, beside the table (write_error_files)
        "traceback": error_file(r),
    }


def oversubscribed(r: Record) -> str:
    """The mark of a cell whose ranks outnumbered what they ran on, with how many on how many
    ("more ranks than cores: 8 on 2"); "" for any other (``records.oversubscription``)."""
    if not (crowded := oversubscription(r)):
        return ""
    what = crowded.rsplit(" ", 1)[-1]
    placed = placement_of(r)
    return f"{crowded}: {placed['ranks']} on {placed[what]}"


def _peer_estimate(r: Record) -> int | None:
    """The model-state bytes a peer's own estimator gives for the cell (``peer_estimate`` in its
    settings: DeepSpeed's), if it has one."""
    estimate = r.strategy_settings.get("peer_estimate") if isinstance(r.strategy_settings, dict) else None
    return estimate.get("model_state_bytes") if isinstance(estimate, dict) else None


def _note(r: Record) -> str:
    return first_sentence(r.error) if r.status != "ok" else r.note  # max-size summaries: the answer


#: the folder beside the records that holds each failed cell's whole error (its traceback)
ERRORS_DIR = "errors"


def error_file(r: Record) -> str | None:
    """Where ``r``'s whole error is kept, relative to the table (``errors/<cell>.txt``); None
    for a cell without one. The name says the cell; its hash tells apart two records of one
    cell (another run, a repeat, a max-size answer and its probe)."""
    if r.status == "ok" or not r.error:
        return None
    cell = f"{r.workload}-{r.preset}-{r.strategy}-N{r.world_size}-{r.precision}-b{r.batch_size_per_rank}"
    identity = (r.run_id, r.suite, cell, r.simulated, r.fake, r.activation_checkpointing, r.repeat)
    digest = hashlib.sha1(repr(identity).encode()).hexdigest()[:8]
    name = path_component(cell, separators="replace", limit=80)
    return f"{ERRORS_DIR}/{name}-{digest}.txt"


def write_error_files(records: Sequence[Record], out_dir: Path) -> None:
    """Each failed cell's whole error (the exception and every rank's traceback) in its
    ``error_file``: the tables show its first sentence and link here."""
    for r in records:
        if (name := error_file(r)) is not None:
            path = out_dir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(r.error.rstrip("\n") + "\n")


def format_value(value: object) -> str:
    """How a table cell reads (Markdown and HTML alike): blank for missing, 2943 not 2.94e+03,
    0.000063 not 6.3e-05 (an MFU of a tiny model on a large device)."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, float):  # three significant digits below 1000, whole numbers above
        if abs(value) >= 1000 or value == 0:
            return f"{value:.0f}"
        decimals = max(0, 2 - math.floor(math.log10(abs(value))))
        text = f"{value:.{decimals}f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    return str(value)


def _cell(value: object) -> str:
    return format_value(value).replace("|", "\\|")


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub-style Markdown table from plain rows, without a final newline (own formatter: the
    GPU image may lack ``tabulate``). Cells read as ``format_value`` writes them."""
    header = "| " + " | ".join(columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join([header, rule, *body])


def to_markdown(frame: pd.DataFrame) -> str:
    """The records table as Markdown."""
    if frame.empty:
        return "(no records)\n"
    return markdown_table(list(frame.columns), frame.itertuples(index=False)) + "\n"


def write_tables(records: Sequence[Record], out_dir: Path) -> str:
    """Write ``table.md`` and ``table.csv`` into ``out_dir``; return the Markdown."""
    frame = records_to_frame(records, tracebacks=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = to_markdown(frame)
    (out_dir / "table.md").write_text(md)
    frame.to_csv(out_dir / "table.csv", index=False)
    write_error_files(records, out_dir)
    return md
