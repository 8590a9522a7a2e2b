"""``--workload hf:<ArchitectureClass>``: any transformers architecture, built locally from its
config class (never downloaded) and trained on synthetic token batches.

The preset *is* the configuration: ``default`` (the config class's own defaults: for
``LlamaForCausalLM`` that is Llama-2-7B's shape) or ``key=value,...`` overrides of the config's
fields, plus ``seq_len`` (default 128), joined by ``:`` (``hidden_size=64:num_hidden_layers=2``:
a comma would split it into several presets on the command line); ``--model-config`` (commas,
as elsewhere) and ``--seq-len`` write it. So every record names the exact shape it measured,
and any shape is a preset, as the built-in size families are.

The loss follows the class's head: a causal LM (``...ForCausalLM``, ``...LMHeadModel``) and a
masked LM (``...ForMaskedLM``) predict the batch's own tokens (the model shifts them), a
sequence classifier (``...ForSequenceClassification``) random labels over ``num_labels``; the
model computes it (``outputs.loss``), as it does in training.
"""

from __future__ import annotations

import difflib
import functools
from typing import Any

import torch
from torch import nn

from shardbench.blocks import repeated_blocks
from shardbench.models.base import Inputs, Workload, batch_generator
from shardbench.models.presets.config_string import (
    DEFAULT_PRESET,
    MAX_DEPTH,
    KeywordPresets,
    depth_family,
    format_model_config,  # noqa: F401  (re-exported: the CLI writes presets with it)
    parse_model_config,
)
from shardbench.models.presets.family import SizeFamily

DEFAULT_SEQ_LEN = 128
#: the config field that sets the depth (``attribute_map`` aliases it where a class names it
#: otherwise: GPT-2's ``n_layer``)
DEPTH = "num_hidden_layers"
#: class-name suffix -> the labels its loss needs
HEADS = {
    "ForCausalLM": "tokens",
    "LMHeadModel": "tokens",
    "ForMaskedLM": "tokens",
    "ForSequenceClassification": "classes",
}


#: the largest model the config check lets through: 10 trillion parameters, five times the
#: largest trained; past it a shape is a typo, not a plan
MAX_PARAMS = 10**13


def estimated_params(config: Any) -> int:
    """A lower bound on a transformers config's parameter count, from its fields alone: the
    token embedding plus, per layer, the attention projections (4 h^2) and the MLP (2 h f);
    a field the config lacks counts nothing."""
    field = lambda name: getattr(config, name, None) if isinstance(getattr(config, name, None), int) else 0  # noqa: E731
    hidden, layers, vocab = field("hidden_size"), field(DEPTH), field("vocab_size")
    ffn = field("intermediate_size") or field("n_inner") or 4 * hidden
    return vocab * hidden + layers * (4 * hidden * hidden + 2 * hidden * ffn)


class HFWorkload(Workload):
    """One transformers architecture class; see the module docstring."""

    lr = 1e-4

    def __init__(self, arch: str) -> None:
        import transformers

        model_class = getattr(transformers, arch, None)
        if not (isinstance(model_class, type) and issubclass(model_class, nn.Module)):
            raise ValueError(
                f"hf:{arch}: transformers {transformers.__version__} has no model class {arch!r} "
                "(e.g. hf:LlamaForCausalLM, hf:GPT2LMHeadModel, hf:BertForSequenceClassification)"
            )
        head = next((h for h in HEADS if arch.endswith(h)), None)
        if head is None:
            raise ValueError(
                f"hf:{arch}: no training loss for this class; allowed: classes ending in {', '.join(HEADS)}"
            )
        self.name = f"hf:{arch}"
        self.model_class = model_class
        self.config_class = model_class.config_class
        self.labels = HEADS[head]
        fields = f"{DEFAULT_PRESET}, or key=value,... over the fields of {self.config_class.__name__}"
        self.presets = KeywordPresets(self.config, lambda: fields)
        self._checked: set[str] = set()

    def check_preset(self, preset: str) -> None:
        """The preset's config is valid and the model builds from it (on the meta device: a
        shape the architecture refuses, heads not dividing the width, fails here, before any
        cell runs)."""
        if preset in self._checked:
            return
        config, _ = self.config(preset)
        try:
            with torch.device("meta"):
                self.model_class(config)
        except Exception as e:
            raise ValueError(f"{self.name} with {preset!r}: {type(e).__name__}: {e}") from None
        self._checked.add(preset)

    def config(self, preset: str, *, dropout: bool = True) -> tuple[Any, int]:
        """The model config and sequence length a preset names; ValueError on a bad key."""
        overrides = parse_model_config(preset)
        seq_len = overrides.pop("seq_len", DEFAULT_SEQ_LEN)
        defaults = self.config_class()
        known = set(defaults.to_dict()) | set(getattr(defaults, "attribute_map", {}))
        if unknown := [k for k in overrides if k not in known]:
            close = difflib.get_close_matches(unknown[0], [*known, "seq_len"], n=3)
            hint = f"did you mean {' or '.join(close)}?" if close else "see its fields in transformers' docs"
            raise ValueError(f"{self.name}: {self.config_class.__name__} has no field {unknown[0]!r}; {hint}")
        try:  # through the constructor: fields derived from others (Llama's head_dim) follow them
            config = self.config_class(**overrides)
        except Exception as e:
            raise ValueError(
                f"{self.name}: {self.config_class.__name__}({preset!r}): {type(e).__name__}: {e}"
            ) from None
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"{self.name}: seq_len must be a positive integer, got {seq_len!r}")
        limit = getattr(config, "max_position_embeddings", None)
        if isinstance(limit, int) and seq_len > limit:
            raise ValueError(f"{self.name}: seq_len {seq_len} > max_position_embeddings {limit}")
        self._check_scale(config, preset)
        if self.labels == "classes" and getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = 0  # a classifier over batches > 1 needs one (tokens never use it)
        if not dropout:
            for key, value in config.to_dict().items():
                if ("dropout" in key or "pdrop" in key) and isinstance(value, float):
                    setattr(config, key, 0.0)
        return config, seq_len

    def _check_scale(self, config: Any, preset: str) -> None:
        """Refuse a shape no machine trains, by arithmetic on the config, before anything is built:
        even on the meta device a build takes time per layer (a 100,000-layer GPT-2 would take
        minutes and gigabytes of Python objects just to be refused later)."""
        depth = getattr(config, DEPTH, None)
        if isinstance(depth, int) and depth > MAX_DEPTH:
            raise ValueError(
                f"{self.name} with {preset!r}: {depth:,} layers is over the {MAX_DEPTH:,} this tool "
                "builds (deeper than any Transformer trained); give a smaller depth"
            )
        estimate = estimated_params(config)
        if estimate > MAX_PARAMS:
            raise ValueError(
                f"{self.name} with {preset!r}: about {estimate:.3g} parameters (from its config) is over "
                f"the {MAX_PARAMS:.0e} this tool builds; give a smaller shape"
            )

    def size_family(self, around: str | None = None) -> SizeFamily | None:
        """Every depth (``num_hidden_layers``) of the shape ``around`` names (default: the
        class's defaults), for ``max-size --vary params`` and the claim; None when the class has
        no such field."""
        return self._depth_family(around or DEFAULT_PRESET)

    @functools.cache  # noqa: B019  (one per workload and shape; workloads live as long as the run)
    def _depth_family(self, around: str) -> SizeFamily | None:
        defaults = self.config_class()
        field = getattr(defaults, "attribute_map", {}).get(DEPTH, DEPTH)  # GPT-2: n_layer
        if field not in defaults.to_dict():
            return None
        given = parse_model_config(around)
        knob = DEPTH if DEPTH in given else field  # the name the user wrote, else the class's own
        return depth_family(around, knob, self.param_count)

    def same_shape(self, a: str, b: str) -> bool:
        """Two presets spelling the same model (keys in another order, a field at its default)."""
        (ca, sa), (cb, sb) = self.config(a), self.config(b)
        return sa == sb and ca.to_dict() == cb.to_dict()

    def tokens_per_sample(self, preset: str) -> int:
        return self.config(preset)[1]

    def build(self, preset: str, *, dropout: bool = True) -> nn.Module:
        config, _ = self.config(preset, dropout=dropout)
        return self.model_class(config)

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
        config, seq_len = self.config(preset)
        g = batch_generator(seed=seed, step=step, rank=rank)
        low = 1 if self.labels == "classes" else 0  # never the pad token a classifier looks for
        tokens = torch.randint(low, config.vocab_size, (batch_size, seq_len), generator=g)
        if self.labels == "tokens":
            labels = tokens
        else:
            labels = torch.randint(0, config.num_labels, (batch_size,), generator=g)
        return {"input_ids": tokens.to(device), "labels": labels.to(device)}

    def loss(self, model: nn.Module, inputs: Inputs) -> torch.Tensor:
        return model(**inputs).loss

    def checkpoint_units(self, model: nn.Module) -> list[nn.Module]:
        """The decoder/encoder layers (the children of the model's ``nn.ModuleList``)."""
        return repeated_blocks(model)

    def check_checkpointable(self) -> None:
        """Every transformers architecture holds its layers in an ``nn.ModuleList``."""

    def shard_units(self, model: nn.Module) -> list[nn.Module] | None:
        """The input embedding, then the layers, as for the built-in transformer (and as
        torchtitan wraps ``tok_embeddings``); when the embedding is tied to the output head it
        stays in the root with it (one gather serves both ends)."""
        embedding = model.get_input_embeddings()
        output = model.get_output_embeddings()
        tied = output is not None and getattr(output, "weight", None) is embedding.weight
        return None if tied else [embedding, *repeated_blocks(model)]
