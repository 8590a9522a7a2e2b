"""Workload factories as a user would write them, for ``--workload tests.user_models:<name>``
(``test_workload_specs.py``): a plain module with declared inputs, a Workload of one's own, and
the mistakes a spec can make."""

from __future__ import annotations

from torch import nn

from shardbench.models.custom import Input, ModelSpec
from shardbench.models.transformer import TransformerWorkload


class TinyNet(nn.Module):
    """Two repeated blocks and a head: the shape zero3's default units and AC look for."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(2)))
        self.head = nn.Linear(16, 4)

    def forward(self, x, labels=None):
        return self.head(self.blocks(x))


def tiny_net() -> ModelSpec:
    return ModelSpec(build=TinyNet, inputs={"x": Input((16,)), "labels": Input((), high=4)})


class SizedNet(nn.Module):
    """``depth`` blocks of ``width``: a factory with keyword arguments, a size family by depth."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.inp = nn.Linear(16, width)
        block = lambda: nn.Sequential(nn.Linear(width, width), nn.ReLU())  # noqa: E731
        self.blocks = nn.Sequential(*(block() for _ in range(depth)))
        self.head = nn.Linear(width, 4)

    def forward(self, x, labels=None):
        return self.head(self.blocks(self.inp(x)))


def sized_net(width: int = 16, depth: int = 2) -> ModelSpec:
    return ModelSpec(
        build=lambda: SizedNet(width, depth),
        inputs={"x": Input((16,)), "labels": Input((), high=4)},
        depth="depth",
    )


def own_workload() -> TransformerWorkload:
    return TransformerWorkload()


not_callable = 3


def wrong_type() -> int:
    return 42


def raises() -> ModelSpec:
    raise RuntimeError("no GPU in this config")


def no_blocks() -> ModelSpec:
    return ModelSpec(build=lambda: nn.Linear(4, 2), inputs={"input": Input((4,))})


def not_a_module() -> ModelSpec:
    return ModelSpec(build=lambda: 3, inputs={"input": Input((4,))})


def exits() -> ModelSpec:
    import sys

    sys.exit(0)


def build_exits() -> ModelSpec:
    import sys

    return ModelSpec(build=lambda: sys.exit(0), inputs={"input": Input((4,))})


def ends_process() -> ModelSpec:
    import os

    os._exit(3)


def sleeps() -> ModelSpec:
    import time

    time.sleep(3600)


def build_sleeps() -> ModelSpec:
    import time

    return ModelSpec(build=lambda: time.sleep(3600), inputs={"input": Input((4,))})


class FrozenNet(nn.Module):
    """A frozen stem before trainable blocks, as in fine-tuning: the stem's weights are held but
    take no gradient and no optimizer state."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(64, 64)
        self.stem.requires_grad_(False)
        self.blocks = nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(2)))
        self.head = nn.Linear(64, 4)

    def forward(self, x, labels=None):
        return self.head(self.blocks(self.stem(x)))


def frozen_net() -> ModelSpec:
    return ModelSpec(build=FrozenNet, inputs={"x": Input((64,)), "labels": Input((), high=4)})


def wrong_inputs() -> ModelSpec:
    """An input named ``x`` for an ``nn.Sequential``, whose ``forward`` takes ``input``."""
    return ModelSpec(build=lambda: nn.Sequential(nn.Linear(4, 2)), inputs={"x": Input((4,))})
