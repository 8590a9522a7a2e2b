"""The device's peak FLOP/s, the denominator of MFU and HFU, and where it comes from.

* A CUDA device in ``DATASHEETS``: the vendor's dense (no structured sparsity) tensor-core
  figure for the step's matmul dtype, from the datasheet named beside it. ``kind`` "datasheet".
* Any other device (every CPU, a GPU not in the table): measured here by a GEMM probe at the
  step's dtype and threads (``gemm_probe``), once per machine: cached in the results home
  (``<home>/peaks/measured.json``) keyed by the device's model, torch's version, the threads and
  the dtype. ``kind`` "measured"; the figure is the probe's best rate, with the median and MAD
  of its repeats beside it.

A datasheet peak is a boost-clock ceiling no real kernel reaches; a measured peak is what one
large GEMM reached on this machine. An MFU against the one does not compare with an MFU against
the other: the record says which it is.

This module imports no torch: the table and the cache are read by commands that never build a
model; only a probe that has to run imports it (``gemm_probe``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardbench.prediction import probe_cache
from shardbench.wording import count

#: the dtypes a step's matrix products run at, as the table and the probe name them
DTYPES = ("bf16", "fp16", "tf32", "fp32")
#: the probe cache's name: ``<home>/peaks/measured.json``
CACHE = "measured"
TERA = 1e12


@dataclass(frozen=True)
class Datasheet:
    """One device's dense peaks in TFLOP/s per dtype. ``pattern`` is searched (a regular
    expression, case-insensitive) in the name ``torch.cuda.get_device_name`` gives."""

    pattern: str
    model: str
    tflops: dict[str, float]
    source: str
    #: the memory's bandwidth in TB/s, from the same datasheet: what a memory-bound optimizer
    #: step runs at (the step-time model's update term)
    memory_tbps: float | None = None


#: Memory bandwidths (``memory_tbps``) are the same datasheets' GPU memory figures: H200 4.8 TB/s,
#: H100 SXM 3.35, PCIe 2.0, NVL 3.9, HGX B200 64 TB/s for 8 GPUs (8 each), A100 40GB 1.555 (the
#: lower of the A100s: the pattern cannot tell 40GB from 80GB), L40S 864 GB/s, L4 300, A10 600.
#: Dense figures: a datasheet's tensor-core numbers marked "with sparsity" are halved. The most
#: specific pattern of a family comes first (``H100 PCIe`` before ``H100``).
DATASHEETS: tuple[Datasheet, ...] = (
    # NVIDIA H200 Tensor Core GPU datasheet, H200 NVL column: FP32 60, TF32 835*, BF16 1,671*,
    # FP16 1,671* TFLOPS (* with sparsity)
    Datasheet(
        r"\bH200 NVL\b",
        "H200 NVL",
        {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
        "NVIDIA H200 Tensor Core GPU datasheet (H200 NVL; tensor-core figures halved: listed with sparsity)",
        memory_tbps=4.8,
    ),
    # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: FP32 67, TF32 989*, BF16 1,979*,
    # FP16 1,979* TFLOPS (* with sparsity)
    Datasheet(
        r"\bH200\b",
        "H200 SXM",
        {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5},
        "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM; tensor-core figures halved: listed with sparsity)",
        memory_tbps=4.8,
    ),
    # NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe column: FP32 51, TF32 756*, BF16 1,513*,
    # FP16 1,513* TFLOPS (* with sparsity)
    Datasheet(
        r"\bH100 PCIe\b",
        "H100 PCIe",
        {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5},
        "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe; tensor-core figures halved: listed with sparsity)",
        memory_tbps=2.0,
    ),
    # NVIDIA H100 Tensor Core GPU datasheet, H100 NVL column: FP32 60, TF32 835*, BF16 1,671*,
    # FP16 1,671* TFLOPS (* with sparsity)
    Datasheet(
        r"\bH100 NVL\b",
        "H100 NVL",
        {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
        "NVIDIA H100 Tensor Core GPU datasheet (H100 NVL; tensor-core figures halved: listed with sparsity)",
        memory_tbps=3.9,
    ),
    # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column ("NVIDIA H100 80GB HBM3"): FP32 67,
    # TF32 989*, BF16 1,979*, FP16 1,979* TFLOPS (* with sparsity)
    Datasheet(
        r"\bH100\b",
        "H100 SXM",
        {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5},
        "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM; tensor-core figures halved: listed with sparsity)",
        memory_tbps=3.35,
    ),
    # NVIDIA HGX B200 specifications, per 8-GPU board: FP32 600 TFLOPS, TF32 18 PFLOPS*, FP16/BF16
    # 36 PFLOPS* (* with sparsity); one GPU is an eighth
    Datasheet(
        r"\bB200\b",
        "B200",
        {"fp32": 75.0, "tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0},
        "NVIDIA HGX B200 specifications (one GPU of eight; tensor-core figures halved: listed with sparsity)",
        memory_tbps=8.0,
    ),
    # NVIDIA A100 Tensor Core GPU datasheet (40GB and 80GB, PCIe and SXM alike): FP32 19.5,
    # TF32 156, BF16 312, FP16 312 TFLOPS dense (312 | 624 | 624 with sparsity)
    Datasheet(
        r"\bA100\b",
        "A100",
        {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
        "NVIDIA A100 Tensor Core GPU datasheet (dense figures)",
        memory_tbps=1.555,
    ),
    # NVIDIA L40S datasheet: FP32 91.6, TF32 183 | 366*, BF16 362.05 | 733*, FP16 362.05 | 733*
    # TFLOPS (* with sparsity)
    Datasheet(
        r"\bL40S\b",
        "L40S",
        {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05},
        "NVIDIA L40S datasheet (dense figures)",
        memory_tbps=0.864,
    ),
    # NVIDIA L4 datasheet: FP32 30.3, TF32 120*, BF16 242*, FP16 242* TFLOPS (* with sparsity)
    Datasheet(
        r"\bL4\b",
        "L4",
        {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0},
        "NVIDIA L4 datasheet (tensor-core figures halved: listed with sparsity)",
        memory_tbps=0.3,
    ),
    # NVIDIA A10 datasheet: FP32 31.2, TF32 62.5 | 125*, BF16 125 | 250*, FP16 125 | 250* TFLOPS
    # (* with sparsity); not the A10G, whose clocks differ
    Datasheet(
        r"\bA10\b",
        "A10",
        {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
        "NVIDIA A10 datasheet (dense figures)",
        memory_tbps=0.6,
    ),
)


def check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ValueError(f"unknown matmul dtype {dtype!r}; allowed: {', '.join(DTYPES)}")
    return dtype


def datasheet_peak(device_name: str, dtype: str) -> dict[str, Any] | None:
    """The record's ``peak_flops_per_s`` from the table, or None for a device it lacks."""
    check_dtype(dtype)
    for sheet in DATASHEETS:
        if re.search(sheet.pattern, device_name, flags=re.IGNORECASE):
            return {
                "flops_per_s": sheet.tflops[dtype] * TERA,
                "kind": "datasheet",
                "dtype": dtype,
                "device_name": device_name,
                "source": f"{sheet.source}: {sheet.model} dense {dtype} {sheet.tflops[dtype]:g} TFLOP/s",
                "threads": None,
                "memory_bytes_per_s": sheet.memory_tbps * TERA if sheet.memory_tbps else None,
            }
    return None


#: the probe as the cache calls it: (device, dtype, threads) -> its figures (``gemm_probe.probe``)
Measure = Callable[[str, str, int | None], dict[str, Any]]


def cache_file(home: Path | None = None) -> Path:
    return probe_cache.cache_path(CACHE, home)


def cache_key(device: str, device_name: str, torch_version: str, threads: int | None, dtype: str) -> str:
    """What makes two probes the same measurement: the device and its model, torch (its GEMM
    library comes with it), the threads (on a CPU) and the dtype."""
    where = f"{threads} threads" if device == "cpu" else "device"
    return f"{device} | {device_name} | torch {torch_version} | {where} | {dtype}"


def read_cache(home: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every cached probe, by key; an unreadable cache reads as empty (it is measured again)."""
    return {k: v for k, v in probe_cache.read(CACHE, home).items() if "flops_per_s" in v}


def measured_peak(
    device: str,
    device_name: str,
    dtype: str,
    threads: int | None,
    *,
    torch_version: str,
    home: Path | None = None,
    measure: Measure | None = None,
) -> dict[str, Any]:
    """The record's ``peak_flops_per_s`` from the cache, probing (and caching) when absent."""
    check_dtype(dtype)
    key = cache_key(device, device_name, torch_version, threads if device == "cpu" else None, dtype)
    if measure is None:
        from shardbench.prediction.gemm_probe import probe as measure

    def probe() -> dict[str, Any]:
        threads_here = threads if device == "cpu" else None
        return {
            **measure(device, dtype, threads),
            "device": device,
            "device_name": device_name,
            "torch": torch_version,
            "threads": threads_here,
            "dtype": dtype,
        }

    entry = probe_cache.cached(CACHE, key, probe, home)
    return {
        "flops_per_s": entry["flops_per_s"],
        "kind": "measured",
        "dtype": dtype,
        "device_name": device_name,
        "source": probe_source(entry),
        "threads": entry.get("threads"),
        "median_flops_per_s": entry.get("median_flops_per_s"),
        "mad_flops_per_s": entry.get("mad_flops_per_s"),
        "measured_at": entry.get("measured_at"),
    }


def probe_source(entry: dict[str, Any]) -> str:
    """How a cached figure was measured, in a line."""
    n, repeats = entry.get("n"), entry.get("repeats")
    threads = f", {count(entry['threads'], 'thread')}" if entry.get("threads") else ""
    median, mad = entry.get("median_flops_per_s"), entry.get("mad_flops_per_s")
    spread = (
        f" (median {median / TERA:.3g} ± {mad / TERA:.3g})" if median is not None and mad is not None else ""
    )
    load = entry.get("load_per_core")
    under = "" if load is None else f" at a load of {load:.2f} per core"
    return (
        f"GEMM probe: {n}x{n} @ {n}x{n} {entry.get('dtype')}{threads}, best of {repeats} "
        f"= {entry['flops_per_s'] / TERA:.3g} TFLOP/s{spread}, measured {entry.get('measured_at')}{under}"
    )
