"""The op replay behind the step-time model's compute term: what the count records of a step's
calls, that their JSON form rebuilds the same calls, and what a replay counts."""

from __future__ import annotations

import json
import math
import pickle

import pytest
import torch
from torch import nn

from shardbench.prediction.flops import count_step
from shardbench.prediction.network_profiles import NAMED
from shardbench.prediction.op_calls import (
    OpCall,
    TensorDesc,
    arg_from_json,
    arg_to_json,
    calls_from_json,
    calls_to_json,
    describe,
    largest_call_bytes,
    signature,
)
from shardbench.prediction.op_replay import materialize, operator, replay
from shardbench.prediction.record_step_time import replay_usable
from shardbench.prediction.step_time import StepInputs, predict_step
from shardbench.step_figures import ComputeReplay


def _loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).square().mean()


def _calls(batch: int) -> tuple[OpCall, ...]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    _, calls = count_step(
        model, _loss, lambda: torch.randn(batch, 16), device=torch.device("cpu"), record_calls=True
    )
    assert calls is not None
    return calls_from_json(json.loads(json.dumps(calls_to_json(calls))))  # as a rank hands them on


def test_the_calls_hold_every_call_of_forward_and_backward_with_its_shapes() -> None:
    calls = _calls(8)
    counts = {c.operator: 0 for c in calls}
    for c in calls:
        counts[c.operator] += c.count
    # two layers forward (addmm), and backward's products for the inputs and the weights (mm)
    assert counts["aten.addmm.default"] == 2 and counts["aten.mm.default"] == 3
    assert "aten.gelu.default" in counts and "aten.gelu_backward.default" in counts
    addmm = [c for c in calls if c.operator == "aten.addmm.default"]
    # the first layer's: bias, the batch (8 x 16, row-major) and the weight transposed (16 x 32)
    (first,) = [c for c in addmm if c.args[1].shape == (8, 16)]
    bias, x, weight_t = first.args
    assert (x.stride, x.dtype) == ((16, 1), "float32") and (weight_t.shape, weight_t.stride) == (
        (16, 32),
        (1, 16),
    )
    assert bias.shape == (32,)
    # what replaying it allocates: bias, batch and weight, and its 8 x 32 output (float32)
    assert first.output_bytes == 4 * 8 * 32
    assert largest_call_bytes([first]) == 4 * (32 + 8 * 16 + 16 * 32 + 8 * 32)
    assert largest_call_bytes(calls) >= largest_call_bytes([first])
    # the same step gives the same signature; another batch another
    assert signature(_calls(8)) == signature(calls) != signature(_calls(4))


def test_the_calls_cross_a_process_boundary_whole() -> None:
    """The codec and pickling give back the same typed calls."""
    calls = _calls(4)
    assert calls_from_json(json.loads(json.dumps(calls_to_json(calls)))) == calls
    assert pickle.loads(pickle.dumps(calls)) == calls
    assert all(isinstance(c, OpCall) for c in calls)


def test_arguments_rebuild_as_recorded() -> None:
    expanded = torch.ones(3, 1).expand(3, 5)  # stride 0: one element per row is all it reaches
    described = describe([expanded, [1, 2], (3, 4), -math.inf, torch.bfloat16, None])
    t, as_list, as_tuple, minus_inf, dtype, none = materialize(
        arg_from_json(json.loads(json.dumps(arg_to_json(described))))
    )
    assert t.shape == (3, 5) and t.stride() == (1, 0) and t.untyped_storage().nbytes() == 3 * 4
    assert as_list == [1, 2] and as_tuple == (3, 4) and minus_inf == -math.inf
    assert dtype is torch.bfloat16 and none is None
    assert operator("aten.mul.Tensor") is torch.ops.aten.mul.Tensor


def test_small_integer_tensors_keep_their_values_where_the_count_is_real() -> None:
    """A packed LSTM's batch sizes, a loss's lengths: the work follows the values."""
    lengths = torch.tensor([[3], [2]])
    real = arg_from_json(json.loads(json.dumps(arg_to_json(describe(lengths)))))
    assert real.values == (3, 2) and torch.equal(materialize(real, integers=0), lengths)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = describe(mode.from_tensor(lengths))
    assert fake.values is None and materialize(fake, integers=1).tolist() == [[1], [1]]


def test_a_replay_counts_every_call_and_leaves_out_none_it_can_make() -> None:
    calls = _calls(8)
    before = torch.get_num_threads()
    out = replay(calls, threads=1, copies=2)
    assert out["calls"] == sum(c.count for c in calls) and out["distinct"] == len(calls)
    assert out["unreplayed_calls"] == 0 and out["copies"] == 2 and len(out["seconds_per_copy"]) == 2
    assert out["seconds"] == max(out["seconds_per_copy"]) > 0
    assert torch.get_num_threads() == before


def test_a_call_fresh_tensors_cannot_make_is_counted_out() -> None:
    # an in-place write through an expanded view: torch refuses it on any real tensor
    expanded = torch.ones(3, 1).expand(3, 5)
    bad = OpCall("aten.add_.Tensor", describe((expanded, torch.ones(3, 5))), {}, 7, 0)
    missing = OpCall("aten.no_such_op.default", describe((torch.ones(2),)), {}, 2, 0)
    # lengths must be positive: zeros are refused, ones are not
    with_zeros = TensorDesc((2,), (1,), "int64", "cpu")  # recorded without values, as under fake tensors
    args = (describe(torch.ones(3, 2, 4)), with_zeros, False)
    packed = OpCall("aten._pack_padded_sequence.default", args, {}, 4, 0)
    out = replay([*_calls(8), bad, missing, packed], threads=1)
    assert out["unreplayed_calls"] == 9 and out["calls"] == sum(c.count for c in _calls(8)) + 13
    assert not replay_usable(ComputeReplay(**{**out, "calls": 100, "unreplayed_calls": 6}))
    assert replay_usable(ComputeReplay(**{**out, "calls": 100, "unreplayed_calls": 5}))
    assert not replay_usable(None)


def test_a_measured_compute_replaces_flops_over_rate() -> None:
    profile = NAMED["nvlink"]
    by_flops = predict_step(StepInputs(flops=1e9, rate=1e9), profile)
    measured = predict_step(StepInputs(flops=1e9, rate=1e9, compute_s=0.25), profile)
    assert by_flops["compute"] == pytest.approx(1.0) and measured["compute"] == 0.25
    assert measured["step"] == pytest.approx(0.25)


def test_copies_run_at_once_and_one_that_raises_frees_the_others() -> None:
    from shardbench.prediction.at_once import at_once

    before = torch.get_num_threads()
    assert at_once(lambda i, together: (together(), i * 10, torch.get_num_threads())[1:], 3, 1) == [
        (0, 1),
        (10, 1),
        (20, 1),
    ]
    assert torch.get_num_threads() == before

    def first_fails(index: int, together) -> int:
        if index == 0:
            raise ValueError("copy 0 could not allocate")
        together()  # would wait forever for copy 0 without the abort
        return index

    with pytest.raises(ValueError, match="copy 0"):
        at_once(first_fails, 2, None)


def test_two_owners_of_probes_never_share_their_replays(tmp_path) -> None:
    """A replay is held by the ``MachineProbes`` that made or read it, for its owner's life."""
    from shardbench.prediction.machine_probes import MachineProbes

    calls = _calls(4)
    one, other = MachineProbes(home=tmp_path / "one"), MachineProbes(home=tmp_path / "other")
    first = one.replayed_compute(calls, 1, 1, "a CPU", "torch")
    assert one.replayed_compute(calls, 1, 1, "a CPU", "torch") is first
    assert other.replayed_compute(calls, 1, 1, "a CPU", "torch") is not first
