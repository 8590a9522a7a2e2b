"""``run --scaling`` on a CPU host: the N=1 cell has every core, each rank at N=2 half of them.
Where the peak measured at N=1's threads is no higher than at fewer (a second thread gained
nothing: the cores were busy with other work), N=1's figures and every efficiency set against
it read wrong, and the terminal says so under the table; with free cores it says nothing."""

from __future__ import annotations

from shardbench.report.terminal import terminal_table, thread_peak_lines
from tests.records import make_record

DEVICE = "Intel(R) Xeon(R) Processor"


def _cell(world_size: int, threads: int, peak: float, strategy: str = "ddp"):
    return make_record(
        strategy=strategy,
        world_size=world_size,
        requested_world_size=world_size,
        threads_per_rank=threads,
        samples_per_s=100.0 * world_size,
        step_time_s={"median": 0.08, "mad": 0.001, "n": 5},
        peak_flops_per_s={
            "flops_per_s": peak, "kind": "measured", "threads": threads, "device_name": DEVICE,
            "dtype": "fp32",
        },
    )  # fmt: skip


def test_a_second_thread_that_gained_nothing_is_said_of_the_rows_that_ran_it() -> None:
    busy = [_cell(1, 2, 0.034e12), _cell(2, 1, 0.040e12), _cell(2, 1, 0.040e12, "zero2")]
    line = " ".join(part.strip() for part in thread_peak_lines(busy))  # one line, wrapped
    assert line.startswith("N=1 ran 2 threads a rank")
    assert "0.034 against 0.04 TFLOP/s" in line and "scaling efficiencies set against N=1" in line
    assert "N=1 ran 2 threads a rank" in terminal_table(busy)


def test_free_cores_say_nothing() -> None:
    free = [_cell(1, 2, 0.075e12), _cell(2, 1, 0.040e12), _cell(2, 1, 0.040e12, "zero2")]
    assert thread_peak_lines(free) == []
    assert "threads a rank" not in terminal_table(free)
