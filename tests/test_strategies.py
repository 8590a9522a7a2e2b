"""Every registered multi-rank strategy trains to the single-process reference through the
harness's strategy interface; names, aliases and capability flags are what users see."""

from __future__ import annotations

import pytest

from bench.strategies.registry import canonical_name, get_strategy, strategy_names
from tests.dist import run_in_world
from tests.parity import max_rel_diff, train_reference, train_strategy_rank
from tests.tiny_models import MLPWorkload

MULTI_RANK = ["ddp", "zero1", "zero2", "torch-zero1", "fsdp2-zero2", "fsdp2-zero3"]


def test_registry_names_and_aliases() -> None:
    assert strategy_names() == ["dp", *MULTI_RANK]
    assert canonical_name("sharded") == canonical_name("ddp_sharded") == "zero2"
    with pytest.raises(ValueError, match="allowed: dp, ddp, zero1, zero2, .*sharded \\(= zero2\\)"):
        get_strategy("zero9")


def test_capabilities() -> None:
    flags = {
        n: (
            get_strategy(n).shards_optimizer_state,
            get_strategy(n).shards_gradients,
            get_strategy(n).shards_parameters,
        )
        for n in MULTI_RANK
    }
    assert flags["ddp"] == (False, False, False)
    assert flags["zero1"] == flags["torch-zero1"] == (True, False, False)
    assert flags["zero2"] == flags["fsdp2-zero2"] == (True, True, False)
    assert flags["fsdp2-zero3"] == (True, True, True)


@pytest.mark.parametrize("name", MULTI_RANK[1:])
@pytest.mark.parametrize("world_size", [2, 4])
def test_strategy_matches_reference(name: str, world_size: int) -> None:
    workload = MLPWorkload()
    ref = train_reference(workload, "tiny", world_size, 4, 4)
    states = run_in_world(train_strategy_rank, world_size, name, workload, "tiny", 4, 4)
    diff, where = max_rel_diff(states[0], ref)
    assert diff < 1e-6, f"{name} N={world_size}: {where} off by {diff:.2e}"
