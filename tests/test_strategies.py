"""Every registered multi-rank strategy trains to the single-process reference through the
harness's strategy interface; names, aliases, declared sharding and display are what users see."""

from __future__ import annotations

import pytest

from shardbench.metrics.analytic import REPLICATED, ZERO1, ZERO2, ZERO3, Sharding
from shardbench.strategies.base import Strategy
from shardbench.strategies.registry import (
    canonical_name,
    display_of,
    get_strategy,
    reference_strategy,
    strategy_cards,
    strategy_class,
    strategy_classes,
    strategy_names,
)
from tests.dist import run_in_world
from tests.parity import max_rel_diff, train_reference, train_strategy_rank
from tests.tiny_models import MLPWorkload

MULTI_RANK = ["ddp", "zero1", "zero2", "zero3", "torch-zero1", "fsdp2-zero2", "fsdp2-zero3"]
#: trained to the reference where they shard in groups (tests/test_hybrid_peers.py): flat, each
#: is one of the above
HYBRID = ["fsdp2-hsdp", "deepspeed-zero3-hpz"]
PEERS = [
    "fairscale-zero1",
    "fairscale-zero2",
    "fairscale-zero3",
    "deepspeed-zero1",
    "deepspeed-zero2",
    "deepspeed-zero3",
]


def test_registry_names_and_aliases() -> None:
    assert strategy_names() == ["dp", *MULTI_RANK, *HYBRID[:1], *PEERS, *HYBRID[1:]]
    assert canonical_name("sharded") == canonical_name("ddp_sharded") == "zero2"
    with pytest.raises(ValueError, match="allowed: dp, ddp, zero1, zero2, .*sharded \\(= zero2\\)"):
        get_strategy("zero9")


def test_declared_sharding() -> None:
    sharding = {n: get_strategy(n).sharding for n in [*MULTI_RANK, *HYBRID]}
    assert sharding["ddp"] == REPLICATED
    assert sharding["zero1"] == ZERO1
    assert sharding["torch-zero1"] == Sharding(optimizer_state=True, whole_parameters=True)
    assert sharding["zero2"] == sharding["fsdp2-zero2"] == ZERO2
    assert sharding["zero3"] == sharding["fsdp2-zero3"] == sharding["fsdp2-hsdp"] == ZERO3
    assert sharding["deepspeed-zero3-hpz"] == ZERO3
    # the shards_* flags are read-only views of the declaration, on classes and instances alike
    zero2 = get_strategy("zero2")
    flags = (zero2.shards_optimizer_state, zero2.shards_gradients, zero2.shards_parameters)
    assert flags == (True, True, False)
    assert type(zero2).shards_gradients is True
    with pytest.raises(AttributeError, match="read-only"):
        zero2.shards_gradients = False
    with pytest.raises(TypeError, match="declare its sharding"):
        type("Stale", (Strategy,), {"shards_gradients": True})


def test_declared_display() -> None:
    """Reports read order, colour and role from here; each stage's peer follows ours."""
    classes = strategy_classes()
    displays = {c.name: c.display for c in classes}
    assert [c.name for c in sorted(classes, key=lambda c: c.display.order)] == [
        "dp", "ddp",
        "zero1", "torch-zero1", "fairscale-zero1", "deepspeed-zero1",
        "zero2", "fsdp2-zero2", "fairscale-zero2", "deepspeed-zero2",
        "zero3", "fsdp2-zero3", "fairscale-zero3", "deepspeed-zero3", "fsdp2-hsdp", "deepspeed-zero3-hpz",
    ]  # fmt: skip
    assert len({d.color for d in displays.values()}) == len(displays)
    assert {n for n, d in displays.items() if d.role == "ours"} == {"zero1", "zero2", "zero3"}
    assert reference_strategy() == "ddp"
    assert display_of("sharded") == displays["zero2"] and display_of("zero9") is None


def test_every_card_has_its_implementation() -> None:
    """The catalog (torch-free, what list/report/validation read) and the classes agree: each
    card names a class that declares that card, so neither can drift from the other."""
    for card in strategy_cards():
        cls = strategy_class(card.name)
        assert cls.card is card and cls.name == card.name and cls.sharding == card.sharding
    with pytest.raises(TypeError, match="no strategy card named 'zero9'"):
        type("Unknown", (Strategy,), {}, card="zero9")


@pytest.mark.parametrize("name", MULTI_RANK[1:])
@pytest.mark.parametrize("world_size", [2, 4])
def test_strategy_matches_reference(name: str, world_size: int) -> None:
    workload = MLPWorkload()
    ref = train_reference(workload, "tiny", world_size, 4, 4)
    states = run_in_world(train_strategy_rank, world_size, name, workload, "tiny", 4, 4)
    diff, where = max_rel_diff(states[0], ref)
    assert diff < 1e-6, f"{name} N={world_size}: {where} off by {diff:.2e}"
