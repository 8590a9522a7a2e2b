"""The ``comm`` category: the communication buffers our sharded strategies hold are measured as
such at the peak (not folded into "other"), the six categories still sum to the peak, and a
planned (fake) cell types them exactly as a real one."""

from __future__ import annotations

import pytest

from shardbench.metrics.memory import CATEGORIES
from tests.cells import run_cell_here, tiny_cell


@pytest.mark.parametrize("strategy", ["ddp", "zero2", "zero3"])
def test_comm_sums_with_the_others_to_the_peak(strategy: str) -> None:
    real, fake = (
        run_cell_here(tiny_cell(strategy=strategy, world_size=4, simulate=True, fake=f))
        for f in (False, True)
    )
    for r in (real, fake):
        assert r.status == "ok", r.error
        assert set(r.mem_breakdown_bytes) == set(CATEGORIES)
        assert sum(r.mem_breakdown_bytes.values()) == r.peak_mem_bytes["max"]
    assert real.mem_breakdown_bytes == fake.mem_breakdown_bytes
    # and the collectives a planned cell issues are counted as a real one's (test_comm_volume.py);
    # planned DDP keeps the first step's bucket layout, so it may issue more, smaller calls
    real_ops, fake_ops = real.comm_per_step["ops"], fake.comm_per_step["ops"]
    if strategy == "ddp":
        assert fake_ops["all_reduce"]["bytes"] == real_ops["all_reduce"]["bytes"] == 4 * real.params
    else:
        assert fake_ops == real_ops
    comm = real.mem_breakdown_bytes["comm"]
    if strategy == "ddp":  # its buckets are the gradients (gradient_as_bucket_view=True)
        assert comm == 0
    else:  # gradient buckets in flight at the peak; inputs and buffers stay "other"
        assert comm > 0 and real.mem_breakdown_bytes["other"] < comm
