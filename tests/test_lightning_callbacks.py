"""Lightning's stock callbacks under ``shardbench_zero1/2/3`` against ``strategy="ddp"`` on two
CPU ranks: each trains to ddp's parameters, or is refused at ``fit`` in one line
(``bench/integrations/lightning_callbacks.py``; the table in docs/lightning.md).

Every Trainer of this module runs in one world, started once (the fixture)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.dist import run_distributed
from tests.extras import LIGHTNING
from tests.parity import max_rel_diff

pytestmark = [pytest.mark.xdist_group("test_lightning_callbacks"), LIGHTNING]

TOL = 1e-6
STRATEGIES = ("ddp", "shardbench_zero1", "shardbench_zero2", "shardbench_zero3")
CALLBACKS = (
    "BackboneFinetuning",
    "StochasticWeightAveraging",
    "ModelCheckpoint+resume",
    "LearningRateMonitor",
    "GradientAccumulationScheduler",
    "EarlyStopping",
)


def _callbacks(name: str, folder: str) -> list[Any]:
    from lightning.pytorch import callbacks as cb

    return {
        "BackboneFinetuning": [cb.BackboneFinetuning(unfreeze_backbone_at_epoch=1, backbone_initial_lr=0.05)],
        "StochasticWeightAveraging": [cb.StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=1)],
        "ModelCheckpoint+resume": [cb.ModelCheckpoint(dirpath=folder, save_last=True, every_n_epochs=1)],
        "LearningRateMonitor": [cb.LearningRateMonitor(logging_interval="step")],
        "GradientAccumulationScheduler": [cb.GradientAccumulationScheduler(scheduling={0: 1, 1: 2})],
        "EarlyStopping": [cb.EarlyStopping(monitor="train_loss", patience=0, min_delta=10.0)],
    }[name]


def _fit(strategy: str, name: str, folder: str, rank: int) -> dict[str, torch.Tensor]:
    from lightning.pytorch.loggers import CSVLogger

    from tests.lightning_models import FinetuneLit, trainer

    if strategy == "ddp":
        from lightning.pytorch.strategies import DDPStrategy

        strategy = DDPStrategy()
    torch.manual_seed(0)
    model = FinetuneLit()
    if name == "BackboneFinetuning":  # BackboneFinetuning freezes it at setup: the optimizer is the head's
        model.backbone.requires_grad_(False)
    where = f"{folder}/{name}-{strategy if isinstance(strategy, str) else 'ddp'}"
    # every rank reads every sample (FinetuneLit's docstring says why)
    kwargs: dict[str, Any] = {"max_epochs": 3, "max_steps": -1, "use_distributed_sampler": False}
    if name == "LearningRateMonitor":
        kwargs["logger"] = CSVLogger(where)
    if name == "ModelCheckpoint+resume":  # two epochs, then a fresh Trainer resumes for the third
        kwargs["enable_checkpointing"] = True
        trainer(strategy, callbacks=_callbacks(name, where), **{**kwargs, "max_epochs": 2}).fit(model)
        torch.manual_seed(0)
        model = FinetuneLit()
        if not isinstance(strategy, str):
            from lightning.pytorch.strategies import DDPStrategy

            strategy = DDPStrategy()
        trainer(strategy, callbacks=_callbacks(name, where), **kwargs).fit(
            model, ckpt_path=f"{where}/last.ckpt", weights_only=False
        )
    else:
        trainer(strategy, callbacks=_callbacks(name, where), **kwargs).fit(model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _everything(rank: int, world_size: int, folder: str) -> dict[str, Any]:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    import shardbench.integrations.lightning  # noqa: F401  (registers the strategy names)
    from tests.lightning_models import FinetuneLit, in_rank, trainer

    out: dict[str, Any] = {}
    with in_rank(rank, world_size):
        for name in CALLBACKS:
            for strategy in STRATEGIES:
                try:
                    out[(name, strategy)] = _fit(strategy, name, folder, rank)
                except Exception as e:  # noqa: BLE001 - a refusal is a result here
                    out[(name, strategy)] = f"{type(e).__name__}: {e}"
        from lightning.pytorch.callbacks import EMAWeightAveraging

        try:
            trainer("shardbench_zero3", callbacks=[EMAWeightAveraging()]).fit(FinetuneLit())
            out["ema"] = "no error"
        except Exception as e:  # noqa: BLE001
            out["ema"] = f"{type(e).__name__}: {e}"
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("callbacks")
    return run_distributed(_everything, 2, str(folder), timeout_s=300)


@pytest.mark.parametrize("strategy", STRATEGIES[1:])
@pytest.mark.parametrize("callback", CALLBACKS)
def test_trains_to_ddps_parameters(world: list[dict[str, Any]], callback: str, strategy: str) -> None:
    for rank, out in enumerate(world):
        ours, ddp = out[(callback, strategy)], out[(callback, "ddp")]
        assert not isinstance(ddp, str), f"ddp with {callback}: {ddp}"
        assert not isinstance(ours, str), f"{strategy} with {callback}, rank {rank}: {ours}"
        diff, where = max_rel_diff(ours, ddp)
        assert diff < TOL, f"{strategy} with {callback}, rank {rank}: {where} off by {diff:.2e}"


def test_the_callbacks_changed_the_training(world: list[dict[str, Any]]) -> None:
    """Each callback that changes training did: its ddp result differs from a plain 3-epoch
    fit's (LearningRateMonitor's, which changes only the log; a resumed fit equals a plain one)."""
    out = world[0]
    plain = out[("LearningRateMonitor", "ddp")]
    for name in CALLBACKS:
        if name in ("LearningRateMonitor", "ModelCheckpoint+resume"):
            continue
        assert max_rel_diff(out[(name, "ddp")], plain)[0] > 1e3 * TOL, name


def test_ema_weight_averaging_is_refused_in_one_line_at_stage_3(world: list[dict[str, Any]]) -> None:
    message = world[0]["ema"]
    assert "MisconfigurationException" in message and "EMAWeightAveraging" in message, message
    assert "\n" not in message
