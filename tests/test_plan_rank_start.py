"""A plan's cells start warm: a fake cell planned for CUDA on a host without it touches no
device, so its rank forks from the launcher's warm server like a CPU rank instead of being
exec'd (which imports torch and the workload's library again for every cell). The shard
widths of one strategy then differ only in what depends on S: the step is counted once for
all of them, and each width's memory is its own."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from shardbench.harness import counting, launch


@pytest.mark.skipif(torch.cuda.is_available(), reason="planned on the CPU only where CUDA is absent")
def test_a_fake_cuda_cell_planned_on_the_cpu_forks_and_a_real_one_is_execd(tiny_cell) -> None:
    assert not launch.exec_rank(tiny_cell(device="cpu", fake=True))
    assert not launch.exec_rank(tiny_cell(device="cuda", fake=True, simulate=True))
    assert launch.exec_rank(tiny_cell(device="cuda"))  # a real CUDA rank: never forked


@pytest.mark.skipif(torch.cuda.is_available(), reason="planned on the CPU only where CUDA is absent")
def test_the_shard_widths_of_a_cuda_plan_fork_and_count_their_step_once(tiny_cell, monkeypatch) -> None:
    """Two widths of zero3 on 4 simulated ranks, planned for CUDA here: each rank process is a
    fork (not an exec'd ``_ExecRank``), the run keeps one count of the step, which both
    records carry, and the narrower width holds more model state."""
    from shardbench.harness.validate import plan_cells

    base = tiny_cell(strategy="zero3", world_size=4, device="cuda", fake=True, simulate=True,
                     steps=1, warmup=0, seed=7)  # fmt: skip
    wide, narrow = plan_cells([base, replace(base, shard_group=2)])
    started: list[type] = []
    world = launch.RankWorld

    class Watched(world):  # type: ignore[misc,valid-type]
        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, **kw)
            started.extend(type(p) for p in self.procs)

    monkeypatch.setattr(launch, "RankWorld", Watched)
    a = launch.run_cell(wide, run_id="plan-widths")
    b = launch.run_cell(narrow, run_id="plan-widths")
    assert a.status == b.status == "ok", (a.error, b.error)
    assert started and launch._ExecRank not in started
    kept = counting.StepCounts()
    kept.adopt(launch.counts_file("run plan-widths"))
    assert [k[:4] for k in kept.keys()] == [("transformer", "tiny", base.batch_size, 7)]
    assert replace(a.flops_per_step, count_s=None) == replace(b.flops_per_step, count_s=None)
    assert b.model_state_bytes["total"] > a.model_state_bytes["total"]
