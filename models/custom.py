"""Your own model as a workload: an ``nn.Module`` factory plus its inputs, adapted to the
``Workload`` contract (``models/base.py``) so every strategy, ``--simulate``, ``--fake``,
``max-size`` and ``plan`` take it as they take the built-in ones.

A factory named on the command line (``--workload package.module:factory`` or
``--workload path/to/file.py:factory``, ``models/specs.py``) may return a ``Workload`` of its
own, or a ``ModelSpec``:

    def factory():
        return ModelSpec(
            build=lambda: MyNet(width=1024),          # called once per rank, after seeding
            inputs={"x": Input((3, 64, 64)), "labels": Input((), high=10)},
        )

A factory that takes keyword arguments (``def factory(width=256, depth=4)``) is a family of
shapes: ``--model-config width=512,depth=8`` calls it with them (the preset is that string, as
for ``hf:`` workloads), and a ``ModelSpec(depth="depth")`` names the keyword that sets how many
blocks the model repeats, so ``max-size --vary params`` and the claim can search every depth.

Inputs are declared by shape *per sample* (the batch dimension is prepended): float inputs are
standard normal, integer ones (``high=``) uniform in ``[0, high)``; or ``inputs`` is a function
``(batch_size, generator) -> dict`` for anything else. Either way the data is a function of
(seed, step, rank) only, as the contract requires. The loss comes from the model's output, the
first of: a scalar output; an output with a ``loss`` (a transformers ``ModelOutput``, a dict);
cross-entropy of the output against an integer ``labels`` input; the mean square of the output
(a synthetic objective: memory and step time do not depend on what the loss means, only on the
backward it starts).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from shardbench.blocks import repeated_blocks
from shardbench.models.base import Inputs, Workload, batch_generator
from shardbench.models.forward_inputs import check_forward_takes
from shardbench.models.presets.config_string import (
    DEFAULT_PRESET,
    KeywordPresets,
    depth_family,
    parse_model_config,
)
from shardbench.models.presets.family import SizeFamily
from shardbench.models.user_code import no_exit
from shardbench.tensors import tensors_in


@dataclass(frozen=True)
class Input:
    """One model input, per sample: ``shape`` without the batch dimension; ``high`` makes it
    integer (token ids, class labels) in ``[0, high)``, otherwise standard-normal floats."""

    shape: tuple[int, ...] = ()
    high: int | None = None
    dtype: torch.dtype = torch.float32

    def sample(self, batch_size: int, generator: torch.Generator) -> torch.Tensor:
        size = (batch_size, *self.shape)
        if self.high is not None:
            return torch.randint(0, self.high, size, generator=generator)
        return torch.randn(size, generator=generator).to(self.dtype)


InputsFn = Callable[[int, torch.Generator], Mapping[str, torch.Tensor]]


@dataclass
class ModelSpec:
    """What a factory returns for a plain ``nn.Module``: how to build it and what it reads."""

    build: Callable[[], nn.Module]
    inputs: Mapping[str, Input] | InputsFn
    lr: float = 1e-4
    #: the modules activation checkpointing recomputes and zero3/FSDP2 gather as units; None:
    #: every parameterised child of an ``nn.ModuleList``/``nn.Sequential`` (``repeated_blocks``)
    blocks: Callable[[nn.Module], list[nn.Module]] | None = None
    #: why the model cannot run under FakeTensorMode (shapes that depend on the data), or ""
    not_plannable: str = ""
    #: the factory's keyword argument that sets how many blocks the model repeats: a size family
    #: for ``max-size --vary params`` and the claim (None: search a ``--ladder`` of presets)
    depth: str | None = None


def loss_from_output(output: Any, inputs: Inputs) -> torch.Tensor:
    """The training loss read off a model's output (see the module docstring for the order)."""
    if isinstance(output, torch.Tensor) and output.dim() == 0:
        return output
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    first = next(iter(tensors_in(output)), None)
    if first is None:
        raise ValueError(f"the model's output ({type(output).__name__}) holds no tensor to take a loss from")
    labels = inputs.get("labels")
    if labels is not None and not labels.is_floating_point() and first.is_floating_point():
        return F.cross_entropy(first.reshape(-1, first.shape[-1]).float(), labels.reshape(-1))
    return first.float().pow(2).mean()


class ModuleWorkload(Workload):
    """A ``ModelSpec`` as a ``Workload``: preset ``default`` (the factory called without
    arguments), or keyword arguments for the factory (see the module docstring)."""

    def __init__(self, name: str, spec: ModelSpec, factory: Callable[..., Any] | None = None) -> None:
        self.name = name
        self.spec = spec
        self.factory = factory
        self.lr = spec.lr
        self.not_plannable = spec.not_plannable
        self.presets = KeywordPresets(self.keywords, self._allowed)
        self._specs: dict[str, ModelSpec] = {DEFAULT_PRESET: spec}
        self._meta: dict[str, nn.Module] = {}

    def _allowed(self) -> str:
        names = self.parameters()
        return f"{DEFAULT_PRESET}, or key=value,... over {', '.join(names)}" if names else DEFAULT_PRESET

    def parameters(self) -> list[str]:
        """The factory's keyword arguments (none if it takes none, or is not inspectable)."""
        try:
            signature = inspect.signature(self.factory) if self.factory is not None else None
        except (TypeError, ValueError):
            return []
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        return [p.name for p in signature.parameters.values() if p.kind in kinds] if signature else []

    def keywords(self, preset: str) -> dict[str, Any]:
        """The factory's keyword arguments a preset names; ValueError naming the allowed ones."""
        values = parse_model_config(preset)
        allowed = self.parameters()
        if unknown := [k for k in values if k not in allowed]:
            takes = f"it takes {', '.join(allowed)}" if allowed else "it takes no keyword arguments"
            raise ValueError(f"workload {self.name!r}: the factory has no keyword {unknown[0]!r}; {takes}")
        return values

    def spec_for(self, preset: str) -> ModelSpec:
        """The ``ModelSpec`` the factory returns for ``preset``'s keyword arguments (once each)."""
        if preset not in self._specs:
            values = self.keywords(preset)
            try:
                with no_exit(f"workload {self.name!r}: the factory"):
                    made = self.factory(**values)
            except Exception as e:
                raise ValueError(
                    f"workload {self.name!r}: calling the factory with {preset!r} failed: "
                    f"{type(e).__name__}: {e}"
                ) from e
            if not isinstance(made, ModelSpec):
                raise ValueError(
                    f"workload {self.name!r}: the factory returned a {type(made).__name__} for {preset!r}, "
                    "not a ModelSpec"
                )
            self._specs[preset] = made
        return self._specs[preset]

    def build(self, preset: str, *, dropout: bool = True) -> nn.Module:
        Workload.check_preset(self, preset)  # the name only: check_preset builds (on meta) too
        with no_exit(f"workload {self.name!r}: ModelSpec.build"):
            model = self.spec_for(preset).build()
        if not isinstance(model, nn.Module):
            raise ValueError(
                f"workload {self.name!r}: ModelSpec.build returned {type(model).__name__}, not an nn.Module"
            )
        if not dropout:
            for m in model.modules():
                if isinstance(m, nn.modules.dropout._DropoutNd):
                    m.p = 0.0
        return model

    def size_family(self, around: str | None = None) -> SizeFamily | None:
        """Every depth of ``around``'s shape, when the spec names its depth keyword."""
        knob = self.spec.depth
        if knob is None:
            return None
        if knob not in self.parameters():
            raise ValueError(
                f"workload {self.name!r}: ModelSpec(depth={knob!r}) is not a keyword of the factory"
            )
        return depth_family(around or DEFAULT_PRESET, knob, self.param_count)

    def same_shape(self, a: str, b: str) -> bool:
        return self.keywords(a) == self.keywords(b)

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
        g = batch_generator(seed=seed, step=step, rank=rank)
        declared = self.spec_for(preset).inputs
        if callable(declared):
            made = declared(batch_size, g)
        else:
            made = {k: i.sample(batch_size, g) for k, i in declared.items()}
        return {k: v.to(device) for k, v in made.items()}

    def loss(self, model: nn.Module, inputs: Inputs) -> torch.Tensor:
        return loss_from_output(model(**inputs), inputs)

    def _blocks(self, model: nn.Module) -> list[nn.Module]:
        blocks = self.spec.blocks  # (the same function for every preset of one factory)
        return blocks(model) if blocks is not None else repeated_blocks(model)

    def checkpoint_units(self, model: nn.Module) -> list[nn.Module]:
        blocks = self._blocks(model)
        if not blocks:
            raise ValueError(
                f"workload {self.name!r} has no repeated blocks (no nn.ModuleList/nn.Sequential children "
                "with parameters) to checkpoint; name them with ModelSpec(blocks=...)"
            )
        return blocks

    def check_preset(self, preset: str) -> None:
        """The preset exists and the factory's ``build`` makes an ``nn.Module`` (built once on the
        meta device, before any cell runs: a mistake is one line, not a failed cell per rank)."""
        self.keywords(preset)  # names the keyword that is wrong, and the allowed ones
        super().check_preset(preset)
        self.check_inputs(preset, self._meta_model(preset))

    def check_inputs(self, preset: str, model: nn.Module) -> None:
        """The declared inputs fit the model's ``forward`` by name (``loss`` calls
        ``model(**inputs)``); inputs made by a function are known only once it runs."""
        declared = self.spec_for(preset).inputs
        if not callable(declared):
            check_forward_takes(model, declared, workload=self.name)

    def check_checkpointable(self) -> None:
        """The model has blocks to recompute (a meta build, as ``check_preset``)."""
        self.checkpoint_units(self._meta_model(DEFAULT_PRESET))

    def _meta_model(self, preset: str) -> nn.Module:
        if preset not in self._meta:
            try:
                with torch.device("meta"):
                    self._meta[preset] = self.build(preset)
            except ValueError:
                raise
            except Exception as e:
                raise ValueError(
                    f"workload {self.name!r}: building the model failed: {type(e).__name__}: {e}"
                ) from e
        return self._meta[preset]

    def shard_units(self, model: nn.Module) -> list[nn.Module] | None:
        """The blocks (``ModelSpec.blocks``, else ``repeated_blocks``), for zero3 and FSDP2 alike."""
        return self._blocks(model) or None
