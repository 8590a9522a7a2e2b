"""Records as pytest-benchmark's saved JSON: shardbench runs in the tools that read that format.

One benchmark per ``ok`` record that has its per-step times (``Record.step_times_s``); one round
is one timed training step of the cell (the slowest rank's, see ``bench/metrics/timing.py``),
``iterations`` is 1. Every statistic is computed from those times as pytest-benchmark computes
its own (``pytest_benchmark.stats.Stats``): mean, sample standard deviation, median, min, max,
its quartiles (Wikipedia's methods 2 and 3), the Tukey fences, outlier counts, ops = rounds /
total. A record that keeps only the summary of its step times (median, MAD, p10, p90) is skipped
with that reason: its mean and extremes were not kept, and a median passed off as a mean is the
one thing this export must not write.

Memory (peak, breakdown, prediction), throughput (samples/s, tokens/s, FLOPs per step, the
FLOP/s a rank achieved, MFU and HFU with the peak they are set against), the scaling
efficiency against the run's N=1 cell (``studies.scaling``: its value, or why it has none, and
its flags) and what ran go to ``extra_info``. The module
is pure (records in, a JSON-ready dict out) and imports nothing heavy.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

from shardbench.records import Record, finite, flat_as_none
from shardbench.studies.scaling import Scaling, record_scaling
from shardbench.wording import count

#: the format version written when pytest-benchmark is not installed to ask
FALLBACK_FORMAT_VERSION = "5.1.0"
#: why a record with a step-time summary but no per-step times is not exported
NO_STEP_TIMES = "no per-step times (only their summary)"

#: record fields copied into each benchmark's extra_info (what it measured, beside the time)
EXTRA_FIELDS = (
    "run_id",
    "suite",
    "params",
    "simulated",
    "fake",
    "backend",
    "device",
    "steps",
    "warmup",
    "samples_per_s",
    "tokens_per_s",
    "flops_per_step",
    "achieved_flops_per_s",
    "mfu",
    "hfu",
    "peak_flops_per_s",
    "peak_mem_bytes",
    "mem_breakdown_bytes",
    "predicted_mem_bytes",
    "model_state_bytes",
    "cuda_allocator",
    "strategy_settings",
    "loss",
    "note",
    "env",
)


def benchmark_name(r: Record) -> str:
    """``transformer/tiny/ddp/n2/fp32/b4``; a simulated world is ``n8-sim`` (it timed no
    communication, so it must not be compared with a real world of the same size), and a cell
    with activation checkpointing ends in ``/ac`` (it recomputes, so it is slower by design), and
    one sharded in groups of S smaller than N has ``.../n4/s2/...``.
    Repetition k > 0 of a cell (``run --repeat``, records of schema 3) is ``.../b4/r<k>``: the
    first keeps the cell's name, so runs with and without repeats still match by name."""
    world = f"n{r.world_size}" + ("-sim" if r.simulated else "")
    if (shards := flat_as_none(r.shard_group, r.world_size)) is not None:
        world += f"/s{shards}"
    name = f"{r.workload}/{r.preset}/{r.strategy}/{world}/{r.precision}/b{r.batch_size_per_rank}"
    name += "/ac" if r.activation_checkpointing else ""
    repeat = getattr(r, "repeat", 0) or 0
    return f"{name}/r{repeat}" if repeat else name


def exportable(r: Record) -> bool:
    """An ``ok`` record with its per-step times (fake planning and failures have none). A
    max-size summary is a copy of its largest probe's record, not a step measurement of its own."""
    return r.status == "ok" and r.max_size is None and bool(r.step_times_s)


def why_skipped(r: Record) -> str:
    if r.status != "ok":
        return "not ok"
    if r.max_size is not None:
        return "max-size summary"
    return NO_STEP_TIMES if (r.step_time_s or {}).get("median") is not None else "no step time"


def _quartiles(xs: list[float]) -> tuple[float, float]:
    """pytest-benchmark's q1 and q3 of sorted ``xs``: method 3 for an odd count, 2 for even."""
    n = len(xs)
    if n == 1:
        return xs[0], xs[0]
    if n % 2 == 0:
        return statistics.median(xs[: n // 2]), statistics.median(xs[n // 2 :])
    k, q = n // 4, n % 4
    if q == 1:
        return 0.25 * xs[k - 1] + 0.75 * xs[k], 0.75 * xs[3 * k] + 0.25 * xs[3 * k + 1]
    return 0.75 * xs[k] + 0.25 * xs[k + 1], 0.25 * xs[3 * k + 1] + 0.75 * xs[3 * k + 2]


def _plain(value: Any) -> Any:
    """A record's field as the JSON the record holds (its typed figures as their objects)."""
    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else value


def step_stats(times: Sequence[float]) -> dict[str, Any]:
    """pytest-benchmark's ``stats`` of one benchmark whose rounds took ``times`` seconds."""
    data = [float(t) for t in times]
    xs = sorted(data)
    mean = statistics.mean(data)
    stddev = statistics.stdev(data) if len(data) > 1 else 0.0
    q1, q3 = _quartiles(xs)
    iqr = q3 - q1
    low, high = q1 - 1.5 * iqr, q3 + 1.5 * iqr
    total = sum(data)
    stddev_outliers = sum(t < mean - stddev or t > mean + stddev for t in data)
    iqr_outliers = sum(t < low or t > high for t in data)
    return {
        "min": xs[0],
        "max": xs[-1],
        "mean": mean,
        "stddev": stddev,
        "rounds": len(data),
        "median": statistics.median(data),
        "iqr": iqr,
        "q1": q1,
        "q3": q3,
        "iqr_outliers": iqr_outliers,
        "stddev_outliers": stddev_outliers,
        "outliers": f"{stddev_outliers};{iqr_outliers}",
        "ld15iqr": xs[0] if len(xs) == 1 else xs[bisect_left(xs, low)],
        "hd15iqr": xs[bisect_right(xs, high) - 1],
        "ops": len(data) / total if total else 0,
        "total": total,
        "iterations": 1,
    }


def to_benchmark(r: Record, scaling: Scaling | None = None) -> dict[str, Any]:
    """One record as a benchmark; ``scaling``: its scaling efficiency, or why it has none
    (``studies.scaling.record_scaling`` of its run's records), in ``extra_info``."""
    name = benchmark_name(r)
    return {
        "group": r.workload,
        "name": name,
        "fullname": f"shardbench::{name}",
        "params": {
            "workload": r.workload,
            "preset": r.preset,
            "strategy": r.strategy,
            "world_size": r.world_size,
            "shard_group": flat_as_none(r.shard_group, r.world_size),
            "simulated": r.simulated,
            "activation_checkpointing": r.activation_checkpointing,
            "precision": r.precision,
            "batch_size_per_rank": r.batch_size_per_rank,
            "repeat": getattr(r, "repeat", 0) or 0,
        },
        "param": name.split("/", 1)[1],
        "extra_info": {
            "step_time_s": dict(r.step_time_s or {}),
            **{k: _plain(getattr(r, k)) for k in EXTRA_FIELDS},
            **({} if scaling is None else {"scaling_efficiency": asdict(scaling)}),
        },
        "options": {"timer": "time.perf_counter (synchronized; slowest rank per step)", "warmup": r.warmup},
        "stats": step_stats(r.step_times_s or []),
    }


def _record_time(r: Record) -> datetime | None:
    try:
        return datetime.strptime(str(r.env.get("time")), "%Y-%m-%dT%H:%M:%S%z")
    except ValueError:
        return None


def machine_info(r: Record) -> dict[str, Any]:
    """pytest-benchmark's ``machine_info`` keys where the record knows them, then its own."""
    env = r.env
    return {
        "node": env.get("host"),
        "machine": env.get("device_name"),
        "python_version": env.get("python"),
        "platform": env.get("platform"),
        "cpu_count": env.get("cpu_count"),
        "device": r.device,
        "device_count": env.get("device_count"),
        "torch": env.get("torch"),
        "cuda": env.get("cuda"),
    }


def format_version() -> str:
    try:
        return metadata.version("pytest-benchmark")
    except metadata.PackageNotFoundError:
        return FALLBACK_FORMAT_VERSION


def to_pytest_benchmark(records: Iterable[Record], *, exported_at: datetime | None = None) -> dict[str, Any]:
    """The saved-run JSON (as ``--benchmark-json`` writes it) for the exportable records.

    ``machine_info``/``commit_info`` come from the first exported record's env (each benchmark
    keeps its own in ``extra_info``); ``datetime`` is the latest record's time, or
    ``exported_at`` when none has one. Raises ``ValueError`` when nothing can be exported or two
    records would share a name (export one run at a time)."""
    records = list(records)
    chosen = [r for r in records if exportable(r)]
    if not chosen:
        summaries = sum(why_skipped(r) == NO_STEP_TIMES for r in records)
        why = f"; {summaries} of them hold {NO_STEP_TIMES}" if summaries else ""
        none = f"none of the {count(len(records), 'record')} is ok with step times"
        raise ValueError(f"nothing to export: {none}{why}")
    seen: dict[str, str] = {}
    for r in chosen:
        name = benchmark_name(r)
        if name in seen:
            raise ValueError(
                f"two ok records for {name} (runs {seen[name]} and {r.run_id}): export one run at a time"
            )
        seen[name] = r.run_id
    scaled = record_scaling(records)
    times = [t for t in map(_record_time, chosen) if t is not None]
    when = max(times) if times else (exported_at or datetime.now(UTC))
    first = chosen[0]
    return finite(
        {
            "machine_info": machine_info(first),
            "commit_info": {
                "id": first.env.get("git_sha") or "unknown",
                "time": None,
                "author_time": None,
                "dirty": None,
                "project": "shardbench",
                "branch": None,
            },
            "benchmarks": [to_benchmark(r, scaled.get(id(r))) for r in chosen],
            "datetime": when.astimezone(UTC).isoformat(),
            "version": format_version(),
            "shardbench": {
                "run_ids": sorted({r.run_id for r in chosen}),
                "exported": len(chosen),
                "skipped": [
                    {"name": benchmark_name(r), "status": r.status, "why": why_skipped(r)}
                    for r in records
                    if not exportable(r)
                ],
            },
        }
    )
