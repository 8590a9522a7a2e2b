"""Records as pytest-benchmark's saved JSON: shardbench runs in the tools that read that format.

One benchmark per ``ok`` record that has a step time; one round is one timed training step of
the cell (the slowest rank's, see ``bench/metrics/timing.py``). pytest-benchmark keeps every
sample and computes its statistics from them; a record keeps only a summary of its step times
(median, MAD, p10, p90, n), and pytest-benchmark's loader and tables need every statistic to be a
number. So each stat is either exact or derived from that summary, and every benchmark's
``extra_info["stats"]`` says which, with the record's own ``step_time_s`` beside it:

=========================  =====================================================================
exact                      ``median``, ``rounds`` (= n timed steps), ``iterations`` (= 1)
``stddev``                 1.4826 x MAD (the normal-consistent estimate of the standard deviation)
``q1``, ``q3``, ``iqr``    median -/+ MAD, 2 x MAD (exact for a symmetric distribution)
``mean``                   the median (the mean was not recorded); ``ops`` = 1 / mean and
                           ``total`` = mean x rounds follow pytest-benchmark's definitions
``min``, ``max``           p10, p90: NOT the extremes, which were not recorded
``ld15iqr``, ``hd15iqr``   p10, p90 likewise
outlier counts             not recorded: written as 0 (the table needs a number)
=========================  =====================================================================

Memory (peak, breakdown, prediction), throughput and what ran go to ``extra_info``. The module
is pure (records in, a JSON-ready dict out) and imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

from shardbench.records import Record, finite

#: the normal-consistent scale of the MAD: 1.4826 x MAD estimates the standard deviation
MAD_TO_STDDEV = 1.4826
#: the format version written when pytest-benchmark is not installed to ask
FALLBACK_FORMAT_VERSION = "5.1.0"

STATS_PROVENANCE: dict[str, Any] = {
    "exact": ["median", "rounds", "iterations"],
    "derived": {
        "stddev": "1.4826 * MAD (normal-consistent estimate)",
        "q1": "median - MAD (exact for a symmetric distribution)",
        "q3": "median + MAD (exact for a symmetric distribution)",
        "iqr": "2 * MAD (exact for a symmetric distribution)",
        "mean": "the median (the mean was not recorded)",
        "ops": "1 / mean",
        "total": "mean * rounds",
        "min": "p10 (the minimum was not recorded)",
        "max": "p90 (the maximum was not recorded)",
        "ld15iqr": "p10 (not recorded)",
        "hd15iqr": "p90 (not recorded)",
        "iqr_outliers": "0 (not recorded)",
        "stddev_outliers": "0 (not recorded)",
        "outliers": "'0;0' (not recorded)",
    },
}

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
    with activation checkpointing ends in ``/ac`` (it recomputes, so it is slower by design).
    Repetition k > 0 of a cell (``run --repeat``, records of schema 3) is ``.../b4/r<k>``: the
    first keeps the cell's name, so runs with and without repeats still match by name."""
    world = f"n{r.world_size}" + ("-sim" if r.simulated else "")
    name = f"{r.workload}/{r.preset}/{r.strategy}/{world}/{r.precision}/b{r.batch_size_per_rank}"
    name += "/ac" if r.activation_checkpointing else ""
    repeat = getattr(r, "repeat", 0) or 0
    return f"{name}/r{repeat}" if repeat else name


def exportable(r: Record) -> bool:
    """An ``ok`` record with a measured step time (fake planning and failures have none). A
    max-size summary is a copy of its largest probe's record, not a step measurement of its own."""
    t = r.step_time_s or {}
    return r.status == "ok" and r.max_size is None and t.get("median") is not None and bool(t.get("n"))


def step_stats(t: dict[str, float]) -> dict[str, Any]:
    """pytest-benchmark's ``stats`` from a record's ``step_time_s`` (see the module docstring)."""
    median, mad, n = float(t["median"]), float(t.get("mad") or 0.0), int(t["n"])
    p10, p90 = t.get("p10", median), t.get("p90", median)
    return {
        "min": p10,
        "max": p90,
        "mean": median,
        "stddev": MAD_TO_STDDEV * mad,
        "rounds": n,
        "median": median,
        "iqr": 2 * mad,
        "q1": max(0.0, median - mad),
        "q3": median + mad,
        "iqr_outliers": 0,
        "stddev_outliers": 0,
        "outliers": "0;0",
        "ld15iqr": p10,
        "hd15iqr": p90,
        "ops": 1 / median if median > 0 else 0.0,
        "total": median * n,
        "iterations": 1,
    }


def to_benchmark(r: Record) -> dict[str, Any]:
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
            "simulated": r.simulated,
            "activation_checkpointing": r.activation_checkpointing,
            "precision": r.precision,
            "batch_size_per_rank": r.batch_size_per_rank,
            "repeat": getattr(r, "repeat", 0) or 0,
        },
        "param": name.split("/", 1)[1],
        "extra_info": {
            "stats": STATS_PROVENANCE,
            "step_time_s": dict(r.step_time_s or {}),
            **{k: getattr(r, k) for k in EXTRA_FIELDS},
        },
        "options": {"timer": "time.perf_counter (synchronized; slowest rank per step)", "warmup": r.warmup},
        "stats": step_stats(r.step_time_s or {}),
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
        raise ValueError(f"nothing to export: none of the {len(records)} records is ok with a step time")
    seen: dict[str, str] = {}
    for r in chosen:
        name = benchmark_name(r)
        if name in seen:
            raise ValueError(
                f"two ok records for {name} (runs {seen[name]} and {r.run_id}): export one run at a time"
            )
        seen[name] = r.run_id
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
            "benchmarks": [to_benchmark(r) for r in chosen],
            "datetime": when.astimezone(UTC).isoformat(),
            "version": format_version(),
            "shardbench": {
                "run_ids": sorted({r.run_id for r in chosen}),
                "exported": len(chosen),
                "skipped": [
                    {
                        "name": benchmark_name(r),
                        "status": r.status,
                        "why": "not ok"
                        if r.status != "ok"
                        else "max-size summary"
                        if r.max_size is not None
                        else "no step time",
                    }
                    for r in records
                    if not exportable(r)
                ],
            },
        }
    )
