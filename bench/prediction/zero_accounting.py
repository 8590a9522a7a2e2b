"""What the ZeRO accounting predicts for a cell, set beside what it measured: model-state bytes
per rank (``predict``) and the communication of one step (``predict_comm``, from the parameter
shapes rank 0 reports: building the model in the launcher would import its library there, which
costs every command seconds). The formulas are ``shardbench.metrics.analytic``'s.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from shardbench.harness.config import CellConfig
from shardbench.harness.job import cell_ranks_per_node
from shardbench.harness.resolved_cell import ResolvedCell
from shardbench.metrics.analytic import CommShape, predicted_comm, predicted_model_state_bytes

if TYPE_CHECKING:
    from shardbench.models.base import Workload


def predict(
    cell: CellConfig | ResolvedCell, world_size: int, num_params: int, trainable: int | None = None
) -> dict[str, int]:
    """The analytic model-state bytes per rank for this cell (bench/metrics/analytic.py)."""
    resolved = ResolvedCell.of(cell)
    cell, strategy = resolved.cell, resolved.strategy
    sharding = strategy.kept_sharding()
    group_sizes = None
    if sharding.whole_parameters:
        group_sizes = resolved.workload.param_group_sizes(cell.preset)
    precision = strategy.model_state_precision(cell.precision)
    return predicted_model_state_bytes(
        num_params,
        world_size,
        precision,
        sharding,
        group_sizes,
        trainable,
        strategy.model_state_shards(world_size, cell.shard_group),
    )


def predict_comm(
    cell: CellConfig | ResolvedCell, world_size: int, backend: str, shape: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The analytic communication per rank per step for this cell (bench/metrics/analytic.py)
    from the shapes a rank reported (``comm_shape_of``); None for a strategy that issues no
    collectives, or when no rank reported them (a failed cell: nothing measured to compare
    with)."""
    resolved = ResolvedCell.of(cell)
    cell = resolved.cell
    comm = resolved.strategy.communication(cell.precision, backend)
    if comm is None or backend == "none" or shape is None:
        return None
    dims = tuple((int(d), int(n)) for d, n in shape["dims"])
    frozen = tuple((int(d), int(n)) for d, n in shape.get("frozen_dims", ()))
    comm_shape = CommShape(
        dims=dims,
        root_elements=shape["root_elements"],
        frozen=frozen,
        root_frozen_elements=shape.get("root_frozen_elements", 0),
    )
    per_node = cell_ranks_per_node(cell.ranks_per_node, world_size)
    return predicted_comm(comm, comm_shape, world_size, cell.shard_group, per_node)


def comm_shape_of(cell: CellConfig | ResolvedCell) -> dict[str, Any] | None:
    """What a rank reports for ``predict_comm``: ``comm_shape`` as JSON, or None when the
    strategy issues no collectives or the shapes cannot be had (no prediction, no failure)."""
    resolved = ResolvedCell.of(cell)
    cell, strategy = resolved.cell, resolved.strategy
    if all(strategy.communication(cell.precision, b) is None for b in ("gloo", "nccl", "fake")):
        return None
    try:
        shape = shape_of(resolved.workload, cell.preset)
    except Exception:  # noqa: BLE001 - a prediction that cannot be made leaves the record without one
        return None
    return {
        "dims": [list(d) for d in shape.dims],
        "root_elements": shape.root_elements,
        "frozen_dims": [list(d) for d in shape.frozen],
        "root_frozen_elements": shape.root_frozen_elements,
    }


@functools.cache
def comm_shape(workload_name: str, preset: str) -> CommShape:
    """``shape_of`` the workload by its name, once per name and preset: a command that predicts
    for many records of one model builds it once."""
    from shardbench.models.registry import get_workload

    return shape_of(get_workload(workload_name), preset)


def shape_of(workload: Workload, preset: str) -> CommShape:
    """The trainable and the frozen parameters' shapes and the root unit's elements of each
    (the parameters no unit of ``Workload.shard_units``, or zero3's default policy, claims), from
    a meta build."""
    import torch

    from shardbench.strategies.sharded.units import find_units

    with torch.device("meta"):
        model = workload.build(preset)
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    named = workload.shard_units(model)
    ids = {id(u) for u in named or ()}
    policy = None if named is None else (lambda module: id(module) in ids)
    root = find_units(model, policy, trainable, frozen)[0]

    def dims(params: list[Any]) -> tuple[tuple[int, int], ...]:
        return tuple((p.shape[0] if p.dim() else 1, p.numel()) for p in params)

    return CommShape(
        dims=dims(trainable),
        root_elements=sum(p.numel() for p in root.params),
        frozen=dims(frozen),
        root_frozen_elements=sum(p.numel() for p in root.frozen),
    )


def workload_params(cell: CellConfig | ResolvedCell) -> int:
    resolved = ResolvedCell.of(cell)
    return resolved.workload.param_count(resolved.cell.preset)
