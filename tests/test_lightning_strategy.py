"""``Trainer(strategy="shardbench_zeroN")`` (``bench/integrations/lightning.py``) against
``strategy="ddp"`` on two CPU ranks: the same parameters after five clipped, scheduled steps
(with and without gradient accumulation, and under bf16-mixed), checkpoints each resumes from
the other's, evaluation without an optimizer, and the configurations it refuses.

Every Trainer of this module runs in one world, started once (the fixture): Lightning's import
and a Trainer's set-up cost seconds, its fits on the tiny module a fraction of one."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import pytest
import torch

from tests.dist import run_distributed
from tests.extras import LIGHTNING
from tests.parity import max_rel_diff

#: one worker runs this module: its module-scoped world runs once (pytest-xdist, loadgroup)
pytestmark = [pytest.mark.xdist_group("test_lightning_strategy"), LIGHTNING]

#: fp32 parity, as the suite's own sharded parity tests hold it (tests/test_sharded_parity.py)
TOL = 1e-6
CLIP = 0.05
STAGES = (1, 2, 3)


def _ddp() -> Any:
    from lightning.pytorch.strategies import DDPStrategy

    return DDPStrategy(find_unused_parameters=True)  # the branch is unused on most steps


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().clone() for k, v in module.state_dict().items()}


def _train(strategy: Any, ckpt_path: str | None = None, sgd: bool = True, **kwargs: Any) -> tuple[Any, Any]:
    from tests.lightning_models import TinyLit, trainer

    torch.manual_seed(0)
    model = TinyLit(sgd=sgd)
    t = trainer(strategy, **kwargs)
    t.fit(model, ckpt_path=ckpt_path, weights_only=False)
    return model, t


def _refusal(strategy: Any, model: Any) -> str:
    from tests.lightning_models import trainer

    try:
        trainer(strategy).fit(model)
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        return f"{type(e).__name__}: {e}"
    return "no error"


def _everything(rank: int, world_size: int, folder: str) -> dict[str, Any]:
    import logging
    import warnings

    import lightning.pytorch as pl

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    from shardbench.integrations.lightning import ShardbenchStrategy  # (registers the names too)
    from shardbench.strategies.sharded import ShardedDataParallel
    from tests.lightning_models import NoBlocksLit, TinyLit, UnshardableLit, in_rank, trainer

    out: dict[str, Any] = {}
    with in_rank(rank, world_size):
        # parity: SGD with momentum, so a clip or a learning rate that did not apply shows
        for accumulate in (1, 2):
            for name in ("ddp", *(f"zero{s}" for s in STAGES)):
                strategy = _ddp() if name == "ddp" else f"shardbench_{name}"
                model, t = _train(strategy, gradient_clip_val=CLIP, accumulate_grad_batches=accumulate)
                out[f"{name}/acc{accumulate}"] = _state(model)
                if name == "zero3" and accumulate == 1:
                    t.save_checkpoint(f"{folder}/zero3.ckpt")
                    out["zero3/ckpt_params"] = _state(model)
        model, _ = _train("shardbench_zero2")
        out["zero2/unclipped"] = _state(model)
        # hybrid: replicated across two groups of one rank (the replicas' all-reduce path)
        class Replicas(pl.Callback):
            def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
                out["zero2-S1/replicas"] = trainer.strategy.model.replicas

        hybrid = ShardbenchStrategy(stage=2, shard_group_size=1)
        model, _ = _train(hybrid, gradient_clip_val=CLIP, callbacks=[Replicas()])
        out["zero2-S1/acc1"] = _state(model)
        out["refused/shard width"] = _refusal(ShardbenchStrategy(stage=2, shard_group_size=3), TinyLit())
        for name in ("ddp", "zero2"):
            model, _ = _train(_ddp() if name == "ddp" else "shardbench_zero2", precision="bf16-mixed")
            out[f"{name}/bf16-mixed"] = _state(model)
        model, t = _train("shardbench_zero2", precision="bf16-true")
        opt = t.optimizers[0]
        out["bf16-true"] = {
            "params": {p.dtype for p in model.parameters()},
            "masters": [(m.dtype, m.numel()) for m in opt.memory_tensors()["optimizer"]],
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "losses": model.losses,
        }

        # the wrapper trains, and validation inside fit goes through it
        class Probe(pl.Callback):
            def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
                out["zero3/wrapped"] = isinstance(trainer.strategy.model, ShardedDataParallel)

        torch.manual_seed(0)
        fitted = TinyLit(sgd=True)
        t = trainer("shardbench_zero3", callbacks=[Probe()], limit_val_batches=2, val_check_interval=3)
        t.fit(fitted)
        # evaluation after fit, on fresh Trainers: no optimizer built, nothing wrapped
        for name in ("ddp", "zero3"):
            t = trainer(_ddp() if name == "ddp" else "shardbench_zero3", limit_val_batches=2)
            out[f"{name}/validate"] = t.validate(fitted, verbose=False)
            out[f"{name}/predict"] = torch.cat(t.predict(fitted))
            out[f"{name}/eval_optimizers"] = len(t.strategy.optimizers)
            out[f"{name}/eval_wrapped"] = t.strategy.model is not fitted

        # checkpoints: AdamW (state of its own), three steps, then two more resumed
        for name in ("ddp", "zero2"):
            _, t = _train(_ddp() if name == "ddp" else "shardbench_zero2", sgd=False, max_steps=3)
            t.save_checkpoint(f"{folder}/{name}.ckpt")
        for saved, resumed in (("zero2", "ddp"), ("zero2", "zero2"), ("ddp", "zero2"), ("ddp", "ddp")):
            strategy = _ddp() if resumed == "ddp" else "shardbench_zero2"
            model, _ = _train(strategy, ckpt_path=f"{folder}/{saved}.ckpt", sgd=False, max_steps=5)
            out[f"resume/{saved}->{resumed}"] = model.losses

        out["refused/no units"] = _refusal("shardbench_zero3", NoBlocksLit())
        out["refused/optimizer"] = _refusal("shardbench_zero2", UnshardableLit())
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("lightning")
    ranks = run_distributed(_everything, 2, str(folder), timeout_s=300)
    return {**ranks[0], "folder": folder, "rank1": ranks[1]}


@pytest.mark.parametrize("accumulate", (1, 2))
@pytest.mark.parametrize("stage", STAGES)
def test_same_parameters_as_ddp(world: dict[str, Any], stage: int, accumulate: int) -> None:
    ddp = world[f"ddp/acc{accumulate}"]
    for rank, result in enumerate((world, world["rank1"])):
        diff, where = max_rel_diff(result[f"zero{stage}/acc{accumulate}"], ddp)
        assert diff < TOL, f"stage {stage}, accumulate {accumulate}, rank {rank}: {where} off by {diff:.2e}"


def test_hybrid_sharding_trains_as_ddp_does(world: dict[str, Any]) -> None:
    """``ShardbenchStrategy(shard_group_size=1)`` at N = 2: two replicas of one rank each."""
    assert world["zero2-S1/replicas"] == 2
    for rank, result in enumerate((world, world["rank1"])):
        diff, where = max_rel_diff(result["zero2-S1/acc1"], world["ddp/acc1"])
        assert diff < TOL, f"rank {rank}: {where} off by {diff:.2e}"


def test_a_shard_width_that_does_not_divide_the_world_is_refused_in_one_line(world: dict[str, Any]) -> None:
    said = world["refused/shard width"]
    assert "shard_group_size must divide the world of 2 ranks, got 3; allowed: 1, 2" in said
    assert "\n" not in said


def test_the_tolerance_sees_a_missing_clip(world: dict[str, Any]) -> None:
    diff, _ = max_rel_diff(world["zero2/unclipped"], world["ddp/acc1"])
    assert diff > 1e3 * TOL


def test_bf16_mixed_trains_fp32_shards_as_ddp_does(world: dict[str, Any]) -> None:
    diff, where = max_rel_diff(world["zero2/bf16-mixed"], world["ddp/bf16-mixed"])
    assert diff < TOL, f"{where} off by {diff:.2e}"
    assert max_rel_diff(world["ddp/bf16-mixed"], world["ddp/acc1"])[0] > TOL  # autocast did run


def test_bf16_true_keeps_fp32_masters_of_its_shard_only(world: dict[str, Any]) -> None:
    got = world["bf16-true"]
    assert got["params"] == {torch.bfloat16}
    assert {dtype for dtype, _ in got["masters"]} == {torch.float32}
    assert sum(n for _, n in got["masters"]) == pytest.approx(got["trainable"] / 2, abs=16)
    assert all(torch.isfinite(torch.tensor(got["losses"])))


def test_stage3_checkpoint_is_consolidated(world: dict[str, Any]) -> None:
    ckpt = torch.load(world["folder"] / "zero3.ckpt", weights_only=False)
    state = {k: v.float() for k, v in ckpt["state_dict"].items()}
    assert max_rel_diff(state, world["zero3/ckpt_params"])[0] == 0
    (optimizer,) = ckpt["optimizer_states"]
    assert optimizer["param_groups"][0]["lr"] == pytest.approx(0.5 * 0.5**2)  # StepLR applied
    assert all(s["momentum_buffer"].shape == ckpt_shape for s, ckpt_shape in _shapes(optimizer, state))


def _shapes(optimizer: dict[str, Any], state: dict[str, torch.Tensor]) -> list[tuple[dict, torch.Size]]:
    """Each optimizer state entry with the shape of its parameter (plain optimizer numbering)."""
    from tests.lightning_models import TinyLit

    params = list(TinyLit().named_parameters())  # the order configure_optimizers lists them in
    return [(s, state[params[i][0]].shape) for i, s in optimizer["state"].items()]


@pytest.mark.parametrize("pair", [("zero2", "ddp"), ("ddp", "zero2")], ids=lambda p: "->".join(p))
def test_resume_from_the_other_strategys_checkpoint(world: dict[str, Any], pair: tuple[str, str]) -> None:
    saved, resumed = pair
    across = world[f"resume/{saved}->{resumed}"]
    same = world[f"resume/{saved}->{saved}"]
    assert len(across) == 2
    # the second loss follows a step that used the loaded Adam state
    assert across == pytest.approx(same, rel=1e-5, abs=1e-6)


def test_checkpoints_hold_the_same_plain_optimizer_state(world: dict[str, Any]) -> None:
    ours, ddp = (torch.load(world["folder"] / f"{n}.ckpt", weights_only=False) for n in ("zero2", "ddp"))
    (a,), (b,) = ours["optimizer_states"], ddp["optimizer_states"]
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for i in b["state"]:
        for key, value in b["state"][i].items():
            assert torch.allclose(a["state"][i][key], value, rtol=1e-4, atol=1e-7), (i, key)
    assert ours["state_dict"].keys() == ddp["state_dict"].keys()


def test_evaluation_needs_no_optimizer(world: dict[str, Any]) -> None:
    assert world["zero3/wrapped"]
    assert world["zero3/validate"] == pytest.approx(world["ddp/validate"])
    assert torch.equal(world["zero3/predict"], world["ddp/predict"])
    assert world["zero3/eval_optimizers"] == 0 and not world["zero3/eval_wrapped"]


def test_unshardable_configurations_are_refused(world: dict[str, Any]) -> None:
    assert "MisconfigurationException" in world["refused/no units"]
    assert "found no units to gather in NoBlocksLit" in world["refused/no units"]
    refused = world["refused/optimizer"]
    assert "cannot shard Adafactor exactly" in refused and "assume_elementwise=True" in refused


def test_precision_and_options_are_refused_when_the_trainer_is_built() -> None:
    import lightning.pytorch as pl
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from shardbench.integrations.lightning import ShardbenchStrategy

    with pytest.raises(MisconfigurationException, match="does not support precision '64-true'"):
        pl.Trainer(strategy="shardbench_zero2", accelerator="cpu", devices=2, precision="64-true")
    with pytest.raises(MisconfigurationException, match="the ZeRO stage is one of 1, 2, 3"):
        ShardbenchStrategy(stage=4)
    with pytest.raises(MisconfigurationException, match="stage 3 options"):
        ShardbenchStrategy(stage=2, unit=torch.nn.Linear)
    for bad in (0, 1.5, True):
        with pytest.raises(MisconfigurationException, match=r"shard_group_size=.*a whole number of ranks"):
            ShardbenchStrategy(stage=2, shard_group_size=bad)


def test_without_lightning_one_line_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lightning", None)
    monkeypatch.delitem(sys.modules, "shardbench.integrations.lightning", raising=False)
    with pytest.raises(ModuleNotFoundError) as raised:
        importlib.import_module("shardbench.integrations.lightning")
    message = str(raised.value)
    assert "'lightning' extra" in message and "shardbench[lightning]" in message
    assert len(message.splitlines()) == 1


def test_the_strategies_are_registered() -> None:
    from lightning.pytorch.strategies import StrategyRegistry

    import shardbench.integrations.lightning  # noqa: F401

    for stage in STAGES:
        strategy = StrategyRegistry.get(f"shardbench_zero{stage}")
        assert strategy.stage == stage


def test_16_mixed_gets_the_sharded_scaler_with_the_stock_ones_settings() -> None:
    """Lightning builds fp16 AMP with torch's scaler, which sees no sharded gradient: the strategy
    swaps in ``ShardedGradScaler``, keeping the scaler's settings (fp16 AMP runs on CUDA only, so
    on a CPU machine the swap is what can be checked; the loop itself: test_sharded_scaler.py)."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    from shardbench.integrations.lightning import ShardbenchStrategy
    from shardbench.strategies.sharded import ShardedGradScaler

    stock = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=7)
    strategy = ShardbenchStrategy(stage=3)
    strategy.precision_plugin = MixedPrecision("16-mixed", "cpu", scaler=stock)
    scaler = strategy.precision_plugin.scaler
    assert isinstance(scaler, ShardedGradScaler)
    assert scaler.get_growth_interval() == 7 and scaler.get_scale() == 1024.0
