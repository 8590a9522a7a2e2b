"""DDP (and our zero3 on the transformer) trains to the same parameters as one process on the
same global batch (N = 1, 2, 4)."""

import pytest
import torch

from tests.dist import run_in_world
from tests.parity import max_rel_diff, train_reference, train_strategy_rank
from tests.tiny_models import MLPWorkload

STEPS, BATCH = 3, 4


def _sgd(model):  # module-level: passed to spawned ranks
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_ddp_adamw_matches_reference(world_size: int) -> None:
    workload = MLPWorkload()
    ref = train_reference(workload, "tiny", world_size, 5, BATCH)
    states = run_in_world(train_strategy_rank, world_size, "ddp", workload, "tiny", 5, BATCH)
    for rank, state in enumerate(states):
        diff, where = max_rel_diff(state, ref)
        assert diff < 1e-6, f"rank {rank}: {where} differs by {diff:.2e} (relative)"
    for state in states[1:]:  # replicas agree with each other exactly
        assert max_rel_diff(state, states[0])[0] == 0.0


@pytest.mark.parametrize(
    ("strategy", "world_size", "checkpointing"),
    [("ddp", 2, False), ("ddp", 4, False), ("zero3", 1, False), ("zero3", 2, False), ("zero3", 4, False),
     ("zero3", 2, True)],
)  # fmt: skip
def test_transformer_matches_reference(strategy: str, world_size: int, checkpointing: bool) -> None:
    """zero3 gathers each BERT layer (the default unit policy) and, with activation
    checkpointing, must have it gathered again when backward recomputes the layer's forward."""
    # SGD: Adam would turn the pure-noise gradients of attention key biases into lr-sized steps
    # (see tests/tiny_models.py), which no elementwise tolerance can compare.
    ref = train_reference("transformer", "tiny", world_size, STEPS, BATCH, _sgd)
    states = run_in_world(
        train_strategy_rank, world_size, strategy, "transformer", "tiny", STEPS, BATCH, _sgd, checkpointing
    )
    for rank, state in enumerate(states):
        diff, where = max_rel_diff(state, ref)
        assert diff < 1e-6, f"{strategy} N={world_size} rank {rank}: {where} differs by {diff:.2e} (relative)"
