"""The op replay behind the step-time model's compute term: what a trace records of a step, that
its JSON form rebuilds the same calls, and what a replay counts."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from shardbench.prediction.flops import count_step_flops
from shardbench.prediction.network_profiles import NAMED
from shardbench.prediction.op_calls import encode, largest_call_bytes, signature
from shardbench.prediction.op_replay import decode, operator, replay
from shardbench.prediction.record_step_time import replay_usable
from shardbench.prediction.step_time import StepInputs, predict_step


def _loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).square().mean()


def _trace(batch: int) -> list[list]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    counted = count_step_flops(
        model, _loss, lambda: torch.randn(batch, 16), device=torch.device("cpu"), trace=True
    )
    return json.loads(json.dumps(counted.trace))  # as a rank hands it to the launcher


def test_the_trace_holds_every_call_of_forward_and_backward_with_its_shapes() -> None:
    trace = _trace(8)
    calls = {name: 0 for name, *_ in trace}
    for name, _, _, n, _ in trace:
        calls[name] += n
    # two layers forward (addmm), and backward's products for the inputs and the weights (mm)
    assert calls["aten.addmm.default"] == 2 and calls["aten.mm.default"] == 3
    assert "aten.gelu.default" in calls and "aten.gelu_backward.default" in calls
    addmm = [entry for entry in trace if entry[0] == "aten.addmm.default"]
    # the first layer's: bias, the batch (8 x 16, row-major) and the weight transposed (16 x 32)
    (first,) = [entry for entry in addmm if entry[1]["list"][1]["t"][0] == [8, 16]]
    bias, x, weight_t = first[1]["list"]
    assert x["t"][1:3] == [[16, 1], "float32"] and weight_t["t"][:2] == [[16, 32], [1, 16]]
    assert bias["t"][0] == [32]
    # what replaying it allocates: bias, batch and weight, and its 8 x 32 output (float32)
    assert first[4] == 4 * 8 * 32 and largest_call_bytes([first]) == 4 * (32 + 8 * 16 + 16 * 32 + 8 * 32)
    assert largest_call_bytes(trace) >= largest_call_bytes([first])
    # the same step gives the same signature; another batch another
    assert signature(_trace(8)) == signature(trace) != signature(_trace(4))


def test_arguments_rebuild_as_recorded() -> None:
    expanded = torch.ones(3, 1).expand(3, 5)  # stride 0: one element per row is all it reaches
    encoded = json.loads(json.dumps(encode([expanded, [1, 2], (3, 4), -math.inf, torch.bfloat16, None])))
    t, as_list, as_tuple, minus_inf, dtype, none = decode(encoded)
    assert t.shape == (3, 5) and t.stride() == (1, 0) and t.untyped_storage().nbytes() == 3 * 4
    assert as_list == [1, 2] and as_tuple == (3, 4) and minus_inf == -math.inf
    assert dtype is torch.bfloat16 and none is None
    assert operator("aten.mul.Tensor") is torch.ops.aten.mul.Tensor


def test_small_integer_tensors_keep_their_values_where_the_count_is_real() -> None:
    """A packed LSTM's batch sizes, a loss's lengths: the work follows the values."""
    lengths = torch.tensor([[3], [2]])
    real = json.loads(json.dumps(encode(lengths)))
    assert real["values"] == [3, 2] and torch.equal(decode(real, integers=0), lengths)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = encode(mode.from_tensor(lengths))
    assert "values" not in fake and decode(fake, integers=1).tolist() == [[1], [1]]


def test_a_replay_counts_every_call_and_leaves_out_none_it_can_make() -> None:
    trace = _trace(8)
    before = torch.get_num_threads()
    out = replay(trace, threads=1, copies=2)
    assert out["calls"] == sum(entry[3] for entry in trace) and out["distinct"] == len(trace)
    assert out["unreplayed_calls"] == 0 and out["copies"] == 2 and len(out["seconds_per_copy"]) == 2
    assert out["seconds"] == max(out["seconds_per_copy"]) > 0
    assert torch.get_num_threads() == before


def test_a_call_fresh_tensors_cannot_make_is_counted_out() -> None:
    # an in-place write through an expanded view: torch refuses it on any real tensor
    expanded = torch.ones(3, 1).expand(3, 5)
    bad = ["aten.add_.Tensor", encode([expanded, torch.ones(3, 5)]), {}, 7, 0]
    missing = ["aten.no_such_op.default", encode([torch.ones(2)]), {}, 2, 0]
    # lengths must be positive: zeros are refused, ones are not
    with_zeros = {"t": [[2], [1], "int64", "cpu"]}  # recorded without values, as under fake tensors
    args = {"list": [encode(torch.ones(3, 2, 4)), with_zeros, False]}
    packed = ["aten._pack_padded_sequence.default", args, {}, 4, 0]
    out = replay([*_trace(8), bad, missing, packed], threads=1)
    assert out["unreplayed_calls"] == 9 and out["calls"] == sum(entry[3] for entry in _trace(8)) + 13
    assert not replay_usable({**out, "calls": 100, "unreplayed_calls": 6})
    assert replay_usable({**out, "calls": 100, "unreplayed_calls": 5})
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
