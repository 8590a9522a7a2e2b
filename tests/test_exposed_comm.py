"""Exposed communication (``bench/metrics/kernel_overlap.py``) and the communication chart, on records
and traces made by hand: a real cell against its simulated twin (with the noise rule), NCCL
kernels against compute kernels in a profiler trace, and the bytes-per-rank chart's lines."""

from __future__ import annotations

import pytest

from shardbench.metrics.kernel_overlap import trace_overlap
from shardbench.report.chart_data import comm_scaling_charts
from shardbench.report.tables import records_to_frame
from shardbench.report.terminal import ratio_lines, terminal_table
from shardbench.studies.exposed_comm import exposed_comm
from tests.records import make_record


def timed(median: float, mad: float = 0.001, steps: int = 5):
    return {"step_time_s": {"median": median, "mad": mad, "n": steps}, "steps": steps}


def test_exposed_is_the_real_step_less_its_simulated_twin() -> None:
    real = make_record(strategy="zero2", **timed(1.0))
    twin = make_record(strategy="zero2", simulated=True, backend="fake", **timed(0.75))
    other = make_record(strategy="ddp", **timed(1.0))  # no twin: nothing to say
    found = exposed_comm([real, twin, other])
    assert set(found) == {id(real)}
    assert found[id(real)].fraction == pytest.approx(0.25)
    assert found[id(real)].verdict.startswith("beyond noise")
    noisy = make_record(strategy="zero2", **timed(1.0, mad=0.2))
    assert exposed_comm([noisy, twin])[id(noisy)].text() == "25% (within noise)"
    few = make_record(strategy="zero2", **timed(1.0, steps=2))
    assert exposed_comm([few, twin])[id(few)].text() == "25% (too few steps)"
    fake_twin = make_record(strategy="zero2", simulated=True, fake=True, **timed(0.5))
    assert exposed_comm([real, fake_twin]) == {}  # a fake cell has no step time to subtract


def test_exposed_reaches_the_table_and_the_summary() -> None:
    real = make_record(strategy="zero2", **timed(1.0))
    twin = make_record(strategy="zero2", simulated=True, backend="fake", **timed(0.75))
    frame = records_to_frame([real, twin])
    assert frame["exposed_comm"].dropna().tolist() == [pytest.approx(0.25)]
    assert "zero2 25%" in terminal_table([real, twin])


def _kernel(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}


def test_trace_overlap_counts_nccl_time_compute_did_not_cover() -> None:
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "step", "ts": 0, "dur": 1000},  # the step: 1 ms
        _kernel("gemm", 0, 300),
        _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 200, 300),  # 100 us under the gemm
        _kernel("ncclDevKernel_AllGather_RING_LL", 400, 200),  # overlaps the first: union 200..600
        _kernel("elementwise", 550, 100),  # covers 550..600
    ]
    got = trace_overlap({"traceEvents": events})
    assert got["comm_s"] == pytest.approx(400e-6)
    assert got["overlapped_s"] == pytest.approx(150e-6)
    assert got["exposed_s"] == pytest.approx(250e-6)
    assert got["exposed_fraction"] == pytest.approx(0.25)
    assert trace_overlap({"traceEvents": [_kernel("gemm", 0, 10)]}) is None  # no NCCL: nothing


def test_comm_chart_has_measured_and_predicted_lines_realest_point_first() -> None:
    def rec(strategy: str, n: int, sent: int, predicted: int, **kw) -> object:
        return make_record(
            strategy=strategy,
            world_size=n,
            requested_world_size=n,
            peak_mem_bytes={"max": 1 << 20, "per_rank": [1 << 20]},
            comm_per_step={"sent_per_rank": sent, "ops": {}},
            predicted_comm={"sent_per_rank": predicted, "ops": {}},
            **kw,
        )

    mib = 1 << 20
    records = [
        rec("ddp", 2, 2 * mib, 2 * mib),
        rec("ddp", 2, 3 * mib, 2 * mib, simulated=True, backend="fake", run_id="s"),  # the real one wins
        rec("ddp", 4, 4 * mib, 4 * mib),  # a third world size: a chart against N needs three
        rec("ddp", 8, 7 * mib, 7 * mib, simulated=True, fake=True, backend="fake"),
        rec("zero2", 2, 3 * mib, 3 * mib),
        rec("zero2", 8, 7 * mib, 7 * mib, simulated=True, fake=True, backend="fake"),
    ]
    (chart,) = comm_scaling_charts(records)
    lines = {(line.series, line.dashed): line for line in chart.panels[0].lines}
    assert lines[("ddp", False)].x == (2, 4, 8) and lines[("ddp", False)].y == (2.0, 4.0, 7.0)
    assert lines[("ddp", False)].hollow == (False, False, True)
    assert lines[("zero2", True)].y == (3.0, 7.0)
    frame = records_to_frame(records)
    assert sorted(frame["comm_vs_pred"].tolist()) == [1.0, 1.0, 1.0, 1.0, 1.0, 1.5]
    assert comm_scaling_charts([r for r in records if r.world_size != 4]) == []  # two N: no chart


def test_ratio_lines_set_bytes_sent_against_ddp() -> None:
    def rec(strategy: str, sent: int):
        return make_record(
            strategy=strategy,
            peak_mem_bytes={"max": 1 << 20, "per_rank": [1 << 20]},
            comm_per_step={"sent_per_rank": sent, "ops": {}},
        )

    (line,) = ratio_lines([rec("ddp", 2000), rec("zero3", 3000)])
    assert "zero3: 1.00x peak, 1.50x bytes sent" in line


def test_a_twin_with_other_threads_is_no_twin_and_crowded_hosts_say_so() -> None:
    real = make_record(strategy="zero2", threads_per_rank=1, env={"cpu_count": 2}, **timed(1.0))
    twin = make_record(strategy="zero2", simulated=True, backend="fake", threads_per_rank=2, **timed(0.75))
    assert exposed_comm([real, twin]) == {}  # computed with two threads: not this rank's compute
    same = make_record(strategy="zero2", simulated=True, backend="fake", threads_per_rank=1, **timed(0.75))
    assert exposed_comm([real, same])[id(real)].text() == "25%"
    n4 = dict(strategy="zero2", world_size=4, requested_world_size=4)
    four = make_record(**n4, env={"cpu_count": 2}, **timed(1.0))
    twin4 = make_record(**n4, simulated=True, **timed(0.5))
    assert exposed_comm([four, twin4])[id(four)].text() == "50% (more ranks than cores)"
