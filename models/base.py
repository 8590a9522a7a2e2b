"""The workload contract every model family implements.

A workload is the unit the harness benchmarks: it knows how to build its model from a named
size preset (never downloading weights), how to make a deterministic synthetic batch for one
rank, and how to compute the training loss. The harness only ever talks to this interface, so a
new model family is one new file in ``models/`` plus a line in ``models/registry.py``.

Data determinism is per (seed, step, rank): rank ``r`` of a world of ``N`` trains on the chunk
``batch(..., rank=r)``, and a single-process reference trains on the concatenation of chunks
``0..N-1``. That makes "same global batch" exact for parity tests without any rank generating
data it does not use.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import torch
from torch import nn

from shardbench.models.presets.family import SizeFamily

Inputs = dict[str, torch.Tensor]


def _adamw_over_trainable(model: nn.Module, *, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)


def batch_generator(*, seed: int, step: int, rank: int) -> torch.Generator:
    """A CPU generator whose stream depends only on (seed, step, rank)."""
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + step) * 65_537 + rank)
    return g


class Workload(ABC):
    """A model family with size presets; see the module docstring for the contract."""

    name: str
    #: preset name -> config overrides; ``tiny`` must exist and train a step in well under 1 s on CPU.
    #: A ``shardbench.models.presets.family.Presets`` also resolves any shape of the workload's size family.
    presets: Mapping[str, dict[str, Any]]
    #: learning rate and optimizer of the paper/reference setting.
    lr: float = 1e-4
    #: named presets in increasing parameter count: the reference points of ``shardbench list``,
    #: and what a max-size search walks when the workload has no size family.
    ladder: tuple[str, ...] = ()
    #: why the workload cannot run under FakeTensorMode (``--fake``), or "" when it can: a model
    #: whose tensor shapes depend on its input's values has no fake-tensor equivalent.
    not_plannable: str = ""

    def check_preset(self, preset: str) -> None:
        if preset not in self.presets:
            presets = self.presets
            allowed = presets.allowed() if hasattr(presets, "allowed") else ", ".join(presets)
            raise ValueError(f"unknown preset {preset!r} for workload {self.name!r}; allowed: {allowed}")

    @abstractmethod
    def build(self, preset: str, *, dropout: bool = True) -> nn.Module:
        """Build the model in fp32 on the current default device, from config only.

        ``dropout=False`` zeroes every dropout probability so runs on different world sizes
        compute identical updates (parity tests); benchmarks keep the reference dropout.
        """

    @abstractmethod
    def batch(
        self,
        preset: str,
        batch_size: int,
        *,
        seed: int,
        step: int,
        rank: int,
        device: torch.device | str = "cpu",
    ) -> Inputs:
        """Deterministic synthetic inputs for one rank at one step."""

    @abstractmethod
    def loss(self, model: nn.Module, inputs: Inputs) -> torch.Tensor:
        """Mean training loss over the batch (mean, so DDP's gradient averaging is exact)."""

    def tokens_per_sample(self, preset: str) -> int | None:
        """The sequence positions one sample runs through the model (a transformer's sequence
        length), for FLOPs and throughput per token; None for a workload without a sequence
        of tokens (images, audio clips of varying length)."""
        return None

    def size_family(self, around: str | None = None) -> SizeFamily | None:
        """The continuous family a max-size search walks (None: search the ``ladder``).
        ``around``: the preset the search starts from; a workload whose shapes are keyword
        arguments (``hf:``, a factory's) grows that shape, the built-in ones ignore it."""
        return getattr(self.presets, "family", None)

    def same_shape(self, a: str, b: str) -> bool:
        """Whether presets ``a`` and ``b`` build the same model (``base`` and ``h768-l12``)."""
        return self.presets[a] == self.presets[b]

    def optimizer_factory(self) -> Callable[[nn.Module], torch.optim.Optimizer]:
        """The reference optimizer as ``factory(model) -> Optimizer``.

        It takes the (unwrapped) model, not a parameter list, so a workload can define parameter
        groups; sharded strategies rebuild the same optimizer class and groups over shards."""
        return functools.partial(_adamw_over_trainable, lr=self.lr)

    def checkpoint_units(self, model: nn.Module) -> list[nn.Module]:
        """The submodules of ``model`` (as ``build`` made it) that activation checkpointing
        recomputes in backward (``--activation-checkpointing``; ``models/checkpointing.py``):
        the repeated blocks, whose inputs are small beside what they save inside. A workload
        that names none cannot run with activation checkpointing."""
        raise ValueError(
            f"workload {self.name!r} declares no activation-checkpointing units; "
            "it needs a checkpoint_units(model) method to run with --activation-checkpointing"
        )

    def shard_units(self, model: nn.Module) -> list[nn.Module] | None:
        """The submodules of ``model`` that parameter-sharding strategies gather as units
        (``zero3``'s unit policy, FSDP2's ``fully_shard`` before the root); None: their default
        (every parameterised child of an ``nn.ModuleList``/``nn.Sequential``, then the root).

        A workload names more only when the default would leave a large module in the root,
        which stays gathered through the whole step; the same list goes to zero3 and FSDP2, so
        their comparison stays like for like."""
        return None

    def check_checkpointable(self) -> None:
        """Raise ValueError if this workload names no activation-checkpointing units."""
        if type(self).checkpoint_units is Workload.checkpoint_units:
            self.checkpoint_units(nn.Module())

    def check_plannable(self) -> None:
        """Raise ValueError saying why, if this workload cannot run under ``--fake``."""
        if self.not_plannable:
            raise ValueError(f"workload {self.name!r} cannot be planned with --fake: {self.not_plannable}")

    def param_group_sizes(self, preset: str) -> list[list[int]]:
        """Elements of each parameter in each group of the reference optimizer, without
        allocating (meta device): what a whole-parameter partition is computed from."""
        self.check_preset(preset)
        with torch.device("meta"):
            optimizer = self.optimizer_factory()(self.build(preset))
        return [[p.numel() for p in g["params"]] for g in optimizer.param_groups]

    def param_count(self, preset: str) -> int:
        """Parameter count without allocating: the model is built on the meta device."""
        self.check_preset(preset)
        with torch.device("meta"):
            model = self.build(preset)
        return sum(p.numel() for p in model.parameters())


class BuiltinWorkload(Workload):
    """A built-in workload: its presets live in a torch-free module of ``models/presets/``
    (``PRESETS``, ``LADDER`` and ``param_count(shape)``), so its size is counted from a preset's
    shape alone, with no build and no import of the model's code (the size ladder of
    ``shardbench list`` and a max-size search count many shapes)."""

    #: the workload's module in ``shardbench.models.presets``
    shapes: ModuleType

    def param_count(self, preset: str) -> int:
        self.check_preset(preset)
        return self.shapes.param_count(self.presets[preset])


def concat_inputs(chunks: list[Inputs]) -> Inputs:
    """Concatenate per-rank chunks along the batch dimension (a reference's global batch)."""
    if len(chunks) == 1:
        return chunks[0]
    return {k: torch.cat([c[k] for c in chunks]) for k in chunks[0]}
