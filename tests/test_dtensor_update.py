"""The update's DTensor dispatch (``bench/prediction/dtensor_update_probe.py``): the shapes a rank's
optimizer steps over as DTensors, the probe that times a step over them, and the term the
step-time model adds for them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from shardbench.metrics.optimizer_tensors import stepped_dtensor_shapes, stepped_elements
from shardbench.prediction.dtensor_update_probe import probe_dtensor_update
from shardbench.prediction.machine_probes import MachineProbes
from shardbench.prediction.record_step_time import predict_record
from shardbench.step_figures import FlopsPerStep
from tests.dist import run_in_world
from tests.probes import plain_probes
from tests.records import make_record

PEAK = {"flops_per_s": 0.2e12, "kind": "measured"}
SHAPES = [[16, 8], [16], [8, 16], [8]]


def _fsdp2_shapes(rank: int, world_size: int) -> tuple[Any, ...]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    frozen = nn.Linear(8, 8)  # not trained: the optimizer never steps it
    frozen.requires_grad_(False)
    model.append(frozen)
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in model[:3:2]:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plain = torch.optim.AdamW([nn.Parameter(torch.zeros(3))])
    return (
        stepped_dtensor_shapes(optimizer),
        stepped_dtensor_shapes(plain),
        stepped_elements(optimizer),
        stepped_elements(plain),
    )


def test_fsdp2s_optimizer_steps_dtensors_of_the_models_global_shapes_in_order() -> None:
    (shapes_0, plain_0, elements_0, plain_elements), (shapes_1, _, elements_1, _) = run_in_world(
        _fsdp2_shapes, 2, timeout_s=120
    )
    assert shapes_0 == shapes_1 == SHAPES  # every rank: the global shapes, not its shard's
    assert plain_0 is None and stepped_dtensor_shapes(object()) is None
    # the elements each rank updates are its shard's: dim 0 split in two
    assert elements_0 == elements_1 == [64, 8, 64, 4] and plain_elements == [3]


def test_the_probe_times_the_dispatch_of_dtensors_beyond_plain_tensors() -> None:
    out = probe_dtensor_update([*SHAPES, [16, 8], []], threads=1)
    assert out["tensors"] == 6 and out["distinct_shapes"] == 5 and out["threads"] == 1
    assert out["dtensor_seconds"] > out["plain_seconds"] > 0
    assert out["dispatch_seconds"] == pytest.approx(out["dtensor_seconds"] - out["plain_seconds"])


def _record(shapes: list[list[int]] | None = SHAPES, ranks: int = 2) -> Any:
    return make_record(
        strategy="fsdp2-zero3",
        world_size=ranks,
        params=1_000,
        flops_per_step=FlopsPerStep(model=1e9, hardware=1e9),
        placement={"ranks": ranks, "cores": 2},
        threads_per_rank=1,
        predicted_mem_bytes={"optimizer": 8_000},
        optimizer_tensors=len(shapes or []),
        optimizer_dtensor_shapes=shapes,
    )


@pytest.mark.parametrize("ranks", [2, 4], ids=["a core a rank", "two ranks a core"])
def test_the_update_adds_the_probed_dispatch_over_the_core_share(tmp_path: Path, ranks: int) -> None:
    asked: list[list[list[int]]] = []

    def dispatch(shapes: list[list[int]], threads: int) -> dict[str, float]:
        asked.append([list(s) for s in shapes])
        return {"dispatch_seconds": 0.05}

    def probes(measure: Any) -> MachineProbes:
        return plain_probes(tmp_path, measure_dtensor_update=measure)

    fsdp2, plain = _record(ranks=ranks), _record(shapes=None, ranks=ranks)
    with_dtensors, _ = predict_record(fsdp2, network="gloo", peak=PEAK, probes=probes(dispatch))
    plain, _ = predict_record(plain, network="gloo", peak=PEAK, probes=probes(None))
    assert asked == [SHAPES]  # measured once, over the rank's own shapes in their order
    share = 2 / ranks
    assert with_dtensors.update == pytest.approx(plain.update + len(SHAPES) * 2e-5 / share + 0.05 / share)
    assert with_dtensors.step - plain.step == pytest.approx(with_dtensors.update - plain.update)
    # cached: a second prediction over the same shapes measures nothing
    predict_record(fsdp2, network="gloo", peak=PEAK, probes=probes(dispatch))
    assert len(asked) == 1
