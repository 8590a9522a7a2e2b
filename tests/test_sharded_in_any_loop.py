"""Our ZeRO in anyone's training loop, at every stage, on 2 and 3 gloo ranks, against one process
training plain AdamW on the global batch (``tests/loop_scenarios.py``): ranks that initialise
their own weights start from rank 0's (frozen ones included); a ``requires_grad`` flipped between
steps is honoured from the next step; a param group added after wrapping trains; and, at stage 3,
every way of reading a parameter between steps is safe, each in a rank process that must not be
killed by a signal."""

from __future__ import annotations

import copy
import io

import pytest
import torch

from tests import loop_scenarios as sc
from tests.dist import run_in_world
from tests.parity import max_rel_diff

TOLERANCE = 1e-5


def _start(rank: int, world_size: int, stage: int) -> dict[str, torch.Tensor]:
    model = sc.Net(seed=rank)  # each rank initialises its own weights; the embedding is frozen
    opt = sc.ShardedOptimizer(sc.groups(model, live_group=False), optim=torch.optim.AdamW)
    wrapped = sc.wrap(model, opt, stage)
    model.calls.fill_(rank)  # a buffer that differs: the first forward brings rank 0's
    wrapped(torch.zeros(1, sc.TOKENS, dtype=torch.int64))
    state = wrapped.full_state_dict()
    wrapped.close()
    return state


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_every_rank_starts_from_rank_0(stage: int) -> None:
    """Every parameter, frozen ones included, and every buffer: rank 0's, bit for bit."""
    states = run_in_world(_start, 3, stage)
    expected = sc.Net(seed=0).state_dict()
    for rank, state in enumerate(states):
        assert state.keys() == expected.keys()
        for name, value in state.items():
            assert torch.equal(value, expected[name]), f"stage {stage} rank {rank}: {name} differs"


#: (param group added live, accumulation): the embedding, frozen at first, is in the optimizer
#: from the start or added as a group of its own when unfrozen
VARIANTS = [(False, False), (False, True), (True, False)]


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_trainability_changes_and_live_groups_match_one_process(stage: int, world_size: int) -> None:
    """One world call per (stage, N) runs every variant; each is judged on its own."""
    results = run_in_world(_variants, world_size, stage, VARIANTS, timeout_s=180)
    for live_group, accumulate in VARIANTS:
        ref = sc.train_reference(world_size, live_group=live_group)
        untrained = sc.Net(seed=0).embed.weight
        assert not torch.equal(ref["embed.weight"], untrained), "the embedding never trained"
        for rank, by_variant in enumerate(results):
            state = by_variant[(live_group, accumulate)]
            where = (
                f"stage {stage} N={world_size} rank {rank} live_group={live_group} accumulate={accumulate}"
            )
            assert not isinstance(state, str), f"{where}: {state}"
            diff, name = max_rel_diff(state, ref)
            assert diff < TOLERANCE, f"{where}: {name} off by {diff:.2e}"


def _variants(rank: int, world_size: int, stage: int, variants: list) -> dict:
    """Each variant's whole state, or the error it raised (the others still run)."""
    out: dict = {}
    for live, acc in variants:
        try:
            out[(live, acc)] = sc.train_sharded(rank, world_size, stage, live_group=live, accumulate=acc)
        except RuntimeError as e:
            out[(live, acc)] = f"{type(e).__name__}: {e}"
    return out


def test_scenarios_can_fail() -> None:
    """Without the broadcast of the frozen embedding, or with the embedding left frozen, the
    comparison above fails: the tolerance sees either."""
    ref = sc.train_reference(2, live_group=False)
    other_start = sc.Net(seed=1).state_dict()
    assert max_rel_diff(other_start, ref)[0] > 100 * TOLERANCE
    untouched = dict(ref, **{"embed.weight": sc.Net(seed=0).embed.weight.detach()})
    assert max_rel_diff(untouched, ref)[0] > 10 * TOLERANCE


def _refuses_mid_accumulation(rank: int, world_size: int, stage: int) -> str:
    model = sc.Net(seed=0)
    opt = sc.ShardedOptimizer(sc.groups(model, live_group=False), optim=torch.optim.AdamW)
    wrapped = sc.wrap(model, opt, stage)
    tokens, target = (t[rank * sc.PER_RANK : (rank + 1) * sc.PER_RANK] for t in sc.batch(0, world_size))
    sc._loss(wrapped, tokens, target).backward()
    model.embed.weight.requires_grad_(True)  # with a gradient held for the next step
    try:
        wrapped(tokens)
    except RuntimeError as e:
        message = str(e)
    else:
        message = ""
    opt.step()  # and the loop goes on: a step, then the change lands at the next forward
    opt.zero_grad()
    sc._loss(wrapped, tokens, target).backward()
    opt.step()
    wrapped.close()
    return message


@pytest.mark.parametrize("stage", [2, 3])
def test_change_while_accumulating_is_refused_in_one_line(stage: int) -> None:
    for message in run_in_world(_refuses_mid_accumulation, 2, stage):
        assert "\n" not in message and "between steps" in message, message


def _storage_covers(p: torch.Tensor) -> bool:
    need = (p.storage_offset() + p.numel()) * p.element_size() if p.numel() else 0
    return p.untyped_storage().nbytes() >= need


def _reads(rank: int, world_size: int) -> dict:
    """Every read of a stage-3 model between steps; returns what each gave."""
    model = sc.Net(seed=rank)
    opt = sc.ShardedOptimizer(sc.groups(model, live_group=False), optim=torch.optim.AdamW, lr=1e-2)
    wrapped = sc.wrap(model, opt, 3)
    tokens, target = (t[rank * sc.PER_RANK : (rank + 1) * sc.PER_RANK] for t in sc.batch(0, world_size))
    loss = sc._loss(wrapped, tokens, target)
    out: dict = {"covered_mid_step": all(_storage_covers(p) for p in model.parameters())}
    loss.backward()
    opt.step()
    out["covered"] = all(_storage_covers(p) for p in model.parameters())
    out["value_reads"] = _value_reads(model)
    for name, read in (("state_dict", model.state_dict), ("deepcopy", lambda: copy.deepcopy(model))):
        try:
            read()
            out[name] = ""
        except RuntimeError as e:
            out[name] = str(e)
    try:
        copy.deepcopy(wrapped)
        out["deepcopy_wrapper"] = ""
    except RuntimeError as e:
        out["deepcopy_wrapper"] = str(e)
    out["wrapper_state_dict"] = wrapped.state_dict()
    out["full"] = wrapped.full_state_dict()
    try:
        model.load_state_dict(out["full"])
        out["inner_load"] = ""
    except RuntimeError as e:
        out["inner_load"] = str(e)
    fresh = {k: v + 1 if v.is_floating_point() else v for k, v in out["wrapper_state_dict"].items()}
    wrapped.load_state_dict(fresh)  # whole values into the shards, and back
    out["loaded"] = wrapped.full_state_dict()
    wrapped.load_state_dict(out["wrapper_state_dict"])
    with wrapped.summon_full_params():
        out["summoned_sum"] = float(sum(p.detach().double().sum() for p in model.parameters()))
        out["inner_state_dict"] = model.state_dict()
        clone = copy.deepcopy(model)
        out["summoned_forward"] = wrapped(tokens).detach()  # nothing is freed inside the block
        out["covered_inside"] = all(_storage_covers(p) and p.numel() for p in model.parameters())
        with torch.no_grad():
            model.head.bias.fill_(0.25)  # a write inside the block is kept
    out["covered_after"] = all(_storage_covers(p) for p in model.parameters())
    out["clone_forward"] = clone(tokens).detach()
    out["clone_hooks"] = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in clone.modules())
    out["after_write"] = wrapped.full_state_dict()["head.bias"]
    loss = sc._loss(wrapped, tokens, target)  # and training goes on
    loss.backward()
    opt.step()
    out["trained_on"] = float(loss.detach())
    wrapped.close()
    return out


def _value_reads(model: torch.nn.Module) -> dict[str, str]:
    """Each way user code reads a parameter's values between steps: "" where it gave a value,
    else the error's text (none may return a wrong number silently)."""
    reads = {
        "sum": lambda p: p.sum(),
        "detach_sum": lambda p: p.detach().sum(),
        "norm": lambda p: p.norm(),
        "clone": lambda p: p.clone(),
        "data": lambda p: p.data,
        "element": lambda p: p.view(-1)[0],
        "save": lambda p: torch.save(p, io.BytesIO()),
        "to_double": lambda p: p.double(),
        "print": lambda p: repr(p),
    }
    out: dict[str, str] = {}
    for name, read in reads.items():
        errors = []
        for p in model.parameters():
            try:
                read(p)
            except RuntimeError as e:
                errors.append(str(e))
        out[name] = errors[0] if len(errors) == len(list(model.parameters())) else f"{len(errors)} refused"
    p = next(model.parameters())
    out["describes"] = f"{p.dtype} {p.requires_grad} {p.cpu() is p} {p.device}"
    return out


def test_stage3_reads_between_steps_are_safe() -> None:
    """Each read runs in a rank process: one killed by a signal fails the world call."""
    for out in run_in_world(_reads, 2):
        for name, text in out["value_reads"].items():
            if name == "describes":  # what describes the tensor still answers
                assert text == "torch.float32 False True cpu" or text.startswith("torch.float32 True"), text
                continue
            # every parameter refuses, in one line naming the ways to the values
            assert "summon_full_params" in text and "full_state_dict" in text, (name, text)
            assert "\n" not in text, text
        assert out["covered_mid_step"] and out["covered"] and out["covered_after"] and out["covered_inside"]
        for k, v in out["full"].items():
            assert torch.equal(out["loaded"][k], v + 1 if v.is_floating_point() else v), k
        for name in ("state_dict", "deepcopy", "inner_load"):
            assert "summon_full_params" in out[name] and "full_state_dict" in out[name], out[name]
            assert "\n" not in out[name]
        assert "summon_full_params" in out["deepcopy_wrapper"]
        full = out["full"]
        assert set(out["wrapper_state_dict"]) == {f"module.{k}" for k in full}
        for k, v in full.items():
            assert torch.equal(out["wrapper_state_dict"][f"module.{k}"], v), k
            assert torch.equal(out["inner_state_dict"][k], v), k
        params = {n for n, _ in sc.Net(seed=0).named_parameters()}
        expected = sum(float(full[n].double().sum()) for n in params)
        assert out["summoned_sum"] == pytest.approx(expected, rel=1e-9)
        assert torch.allclose(out["clone_forward"], out["summoned_forward"], atol=1e-6)
        assert out["clone_hooks"] == 0
        assert torch.equal(out["after_write"], torch.full((2,), 0.25))
        assert out["trained_on"] == out["trained_on"]  # finite: the loop trains on after the reads


def _odd_in_subgroups(rank: int, world_size: int) -> dict:
    """Ranks [0, 2] and [1, 3] of 4 each train as a world of their own, at every stage."""
    import torch.distributed as dist

    pairs = [[0, 2], [1, 3]]
    groups = [dist.new_group(p) for p in pairs]  # (every rank creates every group)
    mine = next(i for i, p in enumerate(pairs) if rank in p)
    out = {s: sc.train_odd_sharded(rank, world_size, s, groups[mine], pairs[mine]) for s in (1, 2, 3)}
    for g in groups:
        dist.destroy_process_group(g)
    return out


def test_sub_groups_one_element_and_mixed_dtype_parameters() -> None:
    """Two sub-groups of a world of 4, each training OddNet as a world of 2 (a 1-element
    parameter, float64 beside float32, a frozen integer one), at every stage: each rank ends
    where one process training on its pair's global batch from its pair's first rank's weights
    (each rank seeds its own) ends."""
    refs = [sc.train_odd_reference(2, seed=first) for first in (0, 1)]
    for rank, by_stage in enumerate(run_in_world(_odd_in_subgroups, 4, timeout_s=180)):
        ref = refs[rank % 2]
        for stage, state in by_stage.items():
            assert state["shift"].dtype == torch.float64 and state["counts"].dtype == torch.int64
            diff, where = max_rel_diff(state, ref)
            assert diff < TOLERANCE, f"stage {stage} rank {rank}: {where} off by {diff:.2e}"
