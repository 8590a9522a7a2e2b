"""The peak FLOP/s MFU is set against (``bench/prediction/peaks.py``): the datasheet table by
device name and dtype, the measured peak's cache (its keys, with the measurement stood in for),
the GEMM probe's method on a small matrix, and the record's throughput arithmetic."""

from __future__ import annotations

import json

import pytest

from shardbench.harness.result import RankResult, build_record
from shardbench.prediction import gemm_probe
from shardbench.prediction.peaks import DATASHEETS, DTYPES, cache_file, datasheet_peak, measured_peak
from shardbench.prediction.step_time import core_share
from shardbench.step_figures import FlopsPerStep
from tests.cells import tiny_cell

TERA = 1e12


@pytest.mark.parametrize(
    "name, dtype, tflops",
    [
        ("NVIDIA H200", "bf16", 989.5),
        ("NVIDIA H200 NVL", "bf16", 835.5),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.5),
        ("NVIDIA H100 80GB HBM3", "fp32", 67.0),
        ("NVIDIA H100 PCIe", "tf32", 378.0),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA A100 80GB PCIe", "tf32", 156.0),
        ("NVIDIA B200", "bf16", 2250.0),
        ("NVIDIA L40S", "bf16", 362.05),
        ("NVIDIA L4", "bf16", 121.0),
        ("NVIDIA L4", "fp32", 30.3),
    ],
)
def test_the_datasheet_table_by_device_name_and_dtype(name: str, dtype: str, tflops: float) -> None:
    peak = datasheet_peak(name, dtype)
    assert peak["flops_per_s"] == tflops * TERA
    assert peak["kind"] == "datasheet" and peak["dtype"] == dtype and peak["source"].startswith("NVIDIA ")


def test_a_device_the_table_lacks_has_no_datasheet_peak_and_every_row_is_complete() -> None:
    assert datasheet_peak("NVIDIA A10G", "bf16") is None  # not the A10: other clocks
    assert datasheet_peak("Intel(R) Xeon(R) Processor", "fp32") is None
    assert all(set(sheet.tflops) == set(DTYPES) for sheet in DATASHEETS)
    with pytest.raises(ValueError, match="unknown matmul dtype 'int8'; allowed: bf16, fp16, tf32, fp32"):
        datasheet_peak("NVIDIA H200", "int8")


def test_the_measured_peak_is_probed_once_per_cpu_torch_threads_and_dtype(tmp_path) -> None:
    calls = []

    def measure(device: str, dtype: str, threads: int | None) -> dict:
        calls.append((device, dtype, threads))
        return {
            "flops_per_s": 1e11 * len(calls),
            "median_flops_per_s": 9e10,
            "mad_flops_per_s": 1e9,
            "repeats": 7,
            "n": 1024,
        }

    def peak(dtype="fp32", threads=1, torch_version="2.11.0", cpu="Xeon"):
        return measured_peak(
            "cpu", cpu, dtype, threads, torch_version=torch_version, home=tmp_path, measure=measure
        )

    first = peak()
    assert first["flops_per_s"] == 1e11 and first["kind"] == "measured" and first["threads"] == 1
    assert "GEMM probe: 1024x1024 @ 1024x1024 fp32, 1 thread, best of 7 = 0.1 TFLOP/s" in first["source"]
    assert peak() == first and len(calls) == 1  # cached: not measured again
    assert peak(threads=2)["flops_per_s"] == 2e11
    assert peak(dtype="bf16")["flops_per_s"] == 3e11
    assert peak(torch_version="2.12.0")["flops_per_s"] == 4e11
    assert peak(cpu="EPYC")["flops_per_s"] == 5e11
    assert peak(threads=2)["flops_per_s"] == 2e11 and len(calls) == 5
    stored = json.loads(cache_file(tmp_path).read_text())["entries"]
    assert cache_file(tmp_path) == tmp_path / "peaks" / "measured.json"
    assert "cpu | Xeon | torch 2.11.0 | 1 threads | fp32" in stored and len(stored) == 5


def test_the_probe_times_each_product_and_reports_the_best_rate(monkeypatch) -> None:
    monkeypatch.setitem(gemm_probe.SIZES, "cpu", 64)
    monkeypatch.setattr(gemm_probe, "BUDGET_S", 0.0)
    out = gemm_probe.probe("cpu", "fp32", 1)
    assert out["n"] == 64 and out["repeats"] == gemm_probe.MIN_REPEATS
    assert out["flops_per_s"] >= out["median_flops_per_s"] > 0 and out["mad_flops_per_s"] >= 0
    with pytest.raises(ValueError, match="unknown matmul dtype"):
        gemm_probe.probe("cpu", "int8", 1)


def test_the_record_sets_the_counted_flops_against_the_step_time_and_the_peak() -> None:
    """Stand-in rank results: rank 0 counted 2e9 model and 3e9 hardware FLOPs for its batch of
    2 sequences of 32 tokens and resolved a 1e12 FLOP/s peak; the slowest rank's median step
    is 0.1 s."""
    cell = tiny_cell(batch_size=2)
    flops = {"model": 2e9, "hardware": 3e9, "tokens_per_sample": 32, "dtype": "fp32"}
    peak = {"flops_per_s": 1e12, "kind": "datasheet", "dtype": "fp32", "device_name": "X", "source": "s"}
    results = [
        RankResult(rank=0, num_params=1000, step_times=[0.1, 0.1, 0.1], flops=flops, peak=peak),
        RankResult(rank=1, num_params=1000, step_times=[0.05, 0.1, 0.08]),
    ]
    r = build_record(cell, cell.world_plan(), results, run_id="t", wall_s=1.0, processes=2)
    assert r.flops_per_step == FlopsPerStep(**flops) and r.peak_flops_per_s == peak
    assert r.achieved_flops_per_s == pytest.approx({"model": 2e10, "hardware": 3e10})
    assert (r.mfu, r.hfu) == pytest.approx((0.02, 0.03))
    assert r.samples_per_s == pytest.approx(2 * 2 / 0.1) and r.tokens_per_s == pytest.approx(40 * 32)
    # its predicted step: the hardware FLOPs at half the datasheet peak on the rank's core share,
    # the update of its optimizer elements; no collective was reported, so none is costed
    p = r.predicted_step_time
    share = core_share(2, r.env["cpu_count"], 1)
    assert p.compute == pytest.approx(3e9 / (1e12 * 0.5 * share)) and p.comm == 0
    elements = r.predicted_mem_bytes["optimizer"] // 8
    assert p.update == pytest.approx(elements * p.seconds_per_update_element)
    assert p.step == pytest.approx(p.compute + p.update) and p.network == "gloo"
