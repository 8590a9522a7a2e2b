"""Memory accounting against theory and against itself: measured model states per rank equal
the analytic ZeRO prediction (real gloo worlds and simulated ones), the breakdown sums to the
tracked peak, and torch-zero1's prediction replays its real whole-parameter partition.

Cells run through ``tests.cells.run_cell_here`` (the worker's rank code and the launcher's record,
without fresh processes): real cells on the session's shared gloo worlds, simulated ones in this
process as rank 0 of a fake world."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

from shardbench.harness.config import CellConfig
from shardbench.metrics.analytic import FORMULAS, predicted_model_state_bytes, whole_parameter_partition
from shardbench.models.registry import get_workload
from tests.cells import run_cell_here, tiny_cell
from tests.dist import run_simulated_here


def _cell(strategy: str, world_size: int, **kw) -> CellConfig:
    return tiny_cell(strategy=strategy, world_size=world_size, steps=1, warmup=2, **kw)


def _assert_model_states_match(record) -> None:
    assert record.status == "ok", record.error
    measured, predicted = record.model_state_bytes, record.predicted_mem_bytes
    for key in ("params", "grads", "optimizer", "total"):
        # + flat-bucket padding and AdamW's 4-byte step counters: far under 1% here
        assert measured[key] == pytest.approx(predicted[key], rel=0.01), (record.strategy, key)


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3"])
def test_real_world_model_states_match_the_zero_formula(strategy: str, world_size: int) -> None:
    record = run_cell_here(_cell(strategy, world_size))
    _assert_model_states_match(record)
    assert len(record.peak_mem_bytes["per_rank"]) == world_size
    # the breakdown is a partition of the tracked peak: nothing missing, nothing counted twice
    assert sum(record.mem_breakdown_bytes.values()) == record.peak_mem_bytes["max"]


@pytest.mark.parametrize("world_size", [8, 64])
@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "torch-zero1"])
def test_simulated_model_states_match_the_prediction(strategy: str, world_size: int) -> None:
    record = run_cell_here(_cell(strategy, world_size, simulate=True))
    _assert_model_states_match(record)
    assert sum(record.mem_breakdown_bytes.values()) == record.peak_mem_bytes["max"]


def _zero_partition(rank: int, world_size: int) -> list[int]:
    model = get_workload("transformer").build("tiny")
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
    return [sum(p.numel() for g in groups for p in g["params"]) for groups in opt._partition_parameters()]


@pytest.mark.parametrize("world_size", [3, 8])
def test_whole_parameter_partition_replays_zero_redundancy_optimizer(world_size: int) -> None:
    sizes = get_workload("transformer").param_group_sizes("tiny")
    assert whole_parameter_partition(sizes, world_size) == run_simulated_here(_zero_partition, world_size)


def test_analytic_table_of_the_paper() -> None:
    psi, n = 1000, 8
    total = {k: predicted_model_state_bytes(psi, n, "fp32", s)["total"] for k, s in FORMULAS.items()}
    assert total == {"dp": 16000, "ddp": 16000, "zero1": 9000, "zero2": 5500, "zero3": 2000}
    mixed = {k: predicted_model_state_bytes(psi, n, "bf16", s)["total"] for k, s in FORMULAS.items()}
    assert mixed == {"dp": 16000, "ddp": 16000, "zero1": 5500, "zero2": 3750, "zero3": 2000}


def test_bf16_prediction_follows_what_each_strategy_stores() -> None:
    """DDP-style strategies train bf16 as autocast over fp32 parameters (4+4+8 bytes), ours keep
    bf16 parameters with fp32 masters (2+2+12): the prediction uses what is really stored."""
    from shardbench.prediction.zero_accounting import predict

    ddp = predict(tiny_cell(world_size=8, precision="bf16"), 8, 1000)
    ours = predict(tiny_cell(strategy="zero2", world_size=8, precision="bf16"), 8, 1000)
    assert (ddp["params"], ddp["grads"], ddp["optimizer"]) == (4000, 4000, 8000)
    assert (ours["params"], ours["grads"], ours["optimizer"]) == (2000, 250, 1500)


def test_memory_held_between_steps_sees_ddps_extra_gradient_copy(monkeypatch) -> None:
    """With ``gradient_as_bucket_view=False`` DDP keeps its buckets beside the gradients: one extra
    gradient-sized copy per rank. The peak can hide it (it moves mid-backward); the memory held
    between steps, which the nightly gate compares, shows it whole."""
    import shardbench.strategies.ddp as ddp

    views = run_cell_here(_cell("ddp", 4, simulate=True))
    monkeypatch.setitem(ddp.DDP_SETTINGS, "gradient_as_bucket_view", False)
    copies = run_cell_here(_cell("ddp", 4, simulate=True))
    assert copies.strategy_settings["gradient_as_bucket_view"] is False
    grads = views.model_state_bytes["grads"]
    extra = copies.model_state_bytes["held"] - views.model_state_bytes["held"]
    assert grads <= extra <= 1.05 * grads, (extra, grads)
    assert views.model_state_bytes["held"] >= views.model_state_bytes["total"]


def test_zero3_bf16_model_states_are_two_two_twelve_over_n() -> None:
    """bf16 parameter chunks and gradient shards, fp32 masters and AdamW state: (2+2+12) Psi / N."""
    record = run_cell_here(_cell("zero3", 8, simulate=True, precision="bf16"))
    _assert_model_states_match(record)
    psi = record.params
    assert record.predicted_mem_bytes["params"] == -(-2 * psi // 8)


def _bucket_bytes(record) -> int:
    return record.strategy_settings["config"]["zero_optimization"]["reduce_bucket_size"] * 4  # fp32


@pytest.mark.parametrize(
    "strategy",
    ["fairscale-zero1", "fairscale-zero2", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3"],
)
def test_a_peers_memory_is_typed_and_its_extras_named(strategy: str) -> None:
    """Each peer's bytes land in their category, "other" holds only the prepared inputs, what a
    peer keeps beyond the ZeRO formula is exactly the buffer its documentation names, and its
    bytes sent per step are counted against the accounting of the collectives it declares."""
    record = run_cell_here(_cell(strategy, 2))
    assert record.status == "ok", record.error
    peak, parts = record.peak_mem_bytes["max"], record.mem_breakdown_bytes
    held, predicted = record.model_state_bytes, record.predicted_mem_bytes
    assert sum(parts.values()) == peak
    assert parts["other"] <= 0.02 * held["total"], parts
    # its collectives of one step, counted, against ZeRO's accounting of what it declares; at
    # stage 3 DeepSpeed keeps its small parameters whole (persistence threshold): never gathered
    sent, predicted_sent = record.comm_per_step["sent_per_rank"], record.predicted_comm["sent_per_rank"]
    if strategy == "deepspeed-zero3":
        assert sent < predicted_sent
    else:
        assert sent == pytest.approx(predicted_sent, rel=0.001)
    if strategy.startswith("fairscale"):  # OSS partitions whole parameters: a little uneven
        assert held["total"] == pytest.approx(predicted["total"], rel=0.01)
        return
    psi = record.params
    # DeepSpeed keeps an fp32 master partition beside AdamW's moments: 12 bytes a parameter / N
    assert held["optimizer"] == pytest.approx(12 * psi / 2, rel=0.001)
    if strategy == "deepspeed-zero3":
        assert held["grads"] == pytest.approx(predicted["grads"], rel=0.001)
        assert parts["comm"] == _bucket_bytes(record)  # its one IPG reduce bucket
        estimate = record.strategy_settings["peer_estimate"]
        largest = estimate["args"]["largest_layer_params"]
        assert estimate["model_state_bytes"] == 4 * largest + int(18 * psi / 2)
    else:
        assert parts["comm"] == 2 * _bucket_bytes(record)  # two IPG buckets (overlap_comm)
        assert held["grads"] == 0  # freed by its step
    if strategy == "deepspeed-zero2":
        assert record.strategy_settings["peer_estimate"]["model_state_bytes"] == 2 * psi + int(18 * psi / 2)
    if strategy == "deepspeed-zero1":
        assert "peer_estimate" not in record.strategy_settings  # DeepSpeed has no stage-1 estimator


@pytest.mark.parametrize(
    "strategy", ["ddp", "zero1", "zero2", "zero3", "torch-zero1", "fsdp2-zero2", "fsdp2-zero3"]
)
def test_a_frozen_layer_is_measured_and_has_no_gradient_or_optimizer_state(strategy: str) -> None:
    """Memory tracking copes with parameters that take no gradient, and the prediction gives
    them parameter bytes only: the measured model states of our stages equal it."""
    cell = CellConfig(
        workload="tests.user_models:frozen_net", preset="default", strategy=strategy, world_size=4,
        batch_size=2, steps=1, warmup=1, simulate=True,
    )  # fmt: skip
    record = run_cell_here(cell)
    assert record.status == "ok", record.error
    trainable = 2 * (64 * 64 + 64) + 64 * 4 + 4  # the blocks and the head; the stem is frozen
    if strategy in ("ddp", "zero1", "zero2", "zero3"):
        _assert_model_states_match(record)
        assert record.predicted_mem_bytes["grads"] == 4 * trainable // (
            1 if strategy in ("ddp", "zero1") else 4
        )
