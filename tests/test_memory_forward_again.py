"""The memory probe follows a module whose forward runs more than once in a step: the root
called from inside its own forward (a LightningModule's ``training_step`` calling ``self(...)``
under a wrapper that runs it as forward), the root called twice (two views of a batch), and a
submodule called twice, with activation-checkpoint recompute in backward.

Each way of running the same layers twice is measured against the way the stock tracker already
follows, a wrapper calling the same inner module twice (a shared submodule): the same tensors are
made and freed in the same order, so the peaks and breakdowns are equal to the byte."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from tests.tracked_steps import tracked_peak

STEPS = 2


class Net(nn.Module):
    """Two linear layers; ``forward`` runs them once, or ``again`` calls the whole module from
    inside itself (re-entrant), as Lightning's wrapper forward does with ``training_step``."""

    def __init__(self, *, checkpointed: bool = False) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 16))
        self.checkpointed = checkpointed
        self.reenter = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reenter:
            self.reenter = False
            try:
                return self(x) + self(x * 2)
            finally:
                self.reenter = True
        if self.checkpointed:
            return checkpoint(self.body, x, use_reentrant=False)
        return self.body(x)


class Twice(nn.Module):
    """The shared-submodule form the stock tracker follows: one inner module called twice."""

    def __init__(self, inner: Net) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + self.inner(x * 2)


def _measure(model: nn.Module, run: Callable[[torch.Tensor], torch.Tensor], params: nn.Module) -> tuple:
    torch.manual_seed(0)
    opt = torch.optim.AdamW(params.parameters(), lr=1e-3)

    def step(x: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        run(x).square().mean().backward()
        opt.step()

    return tracked_peak([model, opt], [torch.randn(8, 16) for _ in range(STEPS)], step)


def _reference(*, checkpointed: bool = False) -> tuple:
    inner = Net(checkpointed=checkpointed)
    wrapper = Twice(inner)
    return _measure(wrapper, wrapper, inner)


def test_the_root_called_from_inside_its_own_forward() -> None:
    net = Net()
    net.reenter = True
    peak = _measure(net, net, net)
    assert peak == _reference() and peak[1]["activations"] > 0


def test_the_root_called_twice_in_a_step() -> None:
    net = Net()
    peak = _measure(net, lambda x: net(x) + net(x * 2), net)
    assert peak == _reference() and peak[1]["activations"] > 0


def test_recomputed_forward_of_a_module_called_from_inside_itself() -> None:
    net = Net(checkpointed=True)
    net.reenter = True
    peak = _measure(net, net, net)
    assert peak == _reference(checkpointed=True) and peak[1]["activations"] > 0
