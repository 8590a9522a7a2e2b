"""A workload's ``shard_units`` reach both parameter-sharding strategies, so zero3 and FSDP2
gather the same modules (the transformer: its embeddings, then each layer) and compare like
for like; a workload naming none keeps each strategy's default wrapping."""

from __future__ import annotations

import torch
from torch import nn

from shardbench.models.registry import get_workload
from shardbench.strategies.base import RankContext
from shardbench.strategies.registry import get_strategy
from tests.cells import run_cell_here, tiny_cell
from tests.dist import fake_world


def test_transformer_names_its_embeddings_and_layers() -> None:
    workload = get_workload("transformer")
    model = workload.build("tiny")
    units = workload.shard_units(model)
    assert units is not None
    assert units[0] is model.bert.embeddings
    assert units[1:] == list(model.bert.encoder.layer)


def test_other_workloads_keep_the_default() -> None:
    workload = get_workload("imagegpt")
    assert workload.shard_units(workload.build("tiny")) is None


def test_zero3_gathers_the_workload_units() -> None:
    record = run_cell_here(tiny_cell(strategy="zero3", world_size=4, simulate=True))
    assert record.status == "ok", record.error
    layers = 2  # the tiny preset
    assert record.strategy_settings["unit_count"] == 1 + 1 + layers  # root, embeddings, layers
    assert "Workload.shard_units" in record.strategy_settings["units"]


def test_fsdp2_wraps_the_workload_units() -> None:
    workload = get_workload("transformer")
    torch.manual_seed(0)
    model = workload.build("tiny")
    strategy = get_strategy("fsdp2-zero3")
    with fake_world(2):
        ctx = RankContext(
            rank=0,
            world_size=2,
            device=torch.device("cpu"),
            process_group=torch.distributed.group.WORLD,
            shard_units=tuple(workload.shard_units(model) or ()),
        )
        strategy.init_world(ctx)
        wrapped, _ = strategy.setup(model, workload.optimizer_factory(), ctx)
        from torch.distributed.fsdp import FSDPModule

        fsdp = [name for name, m in wrapped.named_modules() if isinstance(m, FSDPModule)]
        strategy.teardown()
    assert fsdp == ["", "bert.embeddings", "bert.encoder.layer.0", "bert.encoder.layer.1"]
    assert "Workload.shard_units" in strategy.settings()["wrap"]


def test_fsdp2_default_is_zero3s_default() -> None:
    """The repeated blocks, in nn.Sequential stages too (a ResNet's), and never a ModuleList
    itself (it has no forward for a hook to fire on)."""
    from shardbench.strategies.fsdp2 import shard_units
    from shardbench.strategies.sharded.units import repeated_blocks

    stages = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), nn.Linear(2, 2))
    lists = nn.Sequential(nn.Linear(2, 2), nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)]))
    assert shard_units(stages) == repeated_blocks(stages) == [stages[0], stages[1]]
    assert shard_units(lists) == [lists[0], *lists[1]]
