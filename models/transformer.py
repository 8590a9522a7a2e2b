"""BERT-style Transformer classifier: the ``transformer`` workload.

``BertModel`` built from a ``BertConfig`` (never downloaded), dropout 0.3 on the pooled output,
a linear head and cross-entropy over synthetic token sequences, trained with AdamW at lr 2e-5 as
in the seed. ``base`` is the bert-base-uncased shape (109.5M parameters in encoder + pooler),
``large`` bert-large (335M); ``1b`` to ``20b`` widen and deepen the same architecture for the
model-size ladder (sequence length 128 throughout).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from shardbench.models.base import BuiltinWorkload, Inputs, batch_generator
from shardbench.models.presets import transformer as presets_module

if TYPE_CHECKING:  # transformers takes seconds to import: only building a model needs it
    from transformers import BertConfig


class BertClassifier(nn.Module):
    """BERT encoder + pooled-output dropout + linear head, as the seed trains it."""

    def __init__(self, config: BertConfig, *, num_labels: int, head_dropout: float) -> None:
        from transformers import BertModel

        super().__init__()
        self.bert = BertModel(config, add_pooling_layer=True)
        self.drop = nn.Dropout(head_dropout)
        self.head = nn.Linear(config.hidden_size, num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        pooled = self.bert(input_ids=input_ids, attention_mask=attention_mask).pooler_output
        return self.head(self.drop(pooled))


class TransformerWorkload(BuiltinWorkload):
    name = "transformer"
    lr = 2e-5
    shapes = presets_module
    presets = presets_module.PRESETS
    ladder = presets_module.LADDER

    def _config(self, preset: str, dropout: bool) -> tuple[BertConfig, dict[str, Any]]:
        from transformers import BertConfig

        self.check_preset(preset)
        p = dict(self.presets[preset])
        extra = {k: p.pop(k) for k in ("seq_len", "num_labels")}
        if not dropout:
            p.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return BertConfig(**p), extra

    def build(self, preset: str, *, dropout: bool = True) -> nn.Module:
        config, extra = self._config(preset, dropout)
        return BertClassifier(config, num_labels=extra["num_labels"], head_dropout=0.3 if dropout else 0.0)

    def tokens_per_sample(self, preset: str) -> int:
        """The sequence length: every position is computed, padded ones included (the mask
        only hides them from attention)."""
        self.check_preset(preset)
        return int(self.presets[preset]["seq_len"])

    def checkpoint_units(self, model: nn.Module) -> list[nn.Module]:
        """Each BERT layer (``bert.encoder.layer[i]``: self-attention and feed-forward)."""
        assert isinstance(model, BertClassifier)
        return list(model.bert.encoder.layer)

    def shard_units(self, model: nn.Module) -> list[nn.Module]:
        """The embeddings, then each BERT layer. The default would leave the embeddings in the
        root, which stays gathered from the start of forward to the end of backward: the
        30522-token table is a fifth of bert-base's parameters, and at the largest model a
        2 GiB rank fits under zero3 (N=8, batch 1) it was 182 MiB held through every layer
        (the peak went from 2058 to 1868 MiB with it as a unit of its own). Gathered as its
        own unit it is whole only while it runs, first in forward and last in backward."""
        assert isinstance(model, BertClassifier)
        return [model.bert.embeddings, *model.bert.encoder.layer]

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
        self.check_preset(preset)
        p = self.presets[preset]  # the preset alone: making data needs no transformers import
        g = batch_generator(seed=seed, step=step, rank=rank)
        seq = p["seq_len"]
        ids = torch.randint(0, p["vocab_size"], (batch_size, seq), generator=g)
        # Variable true lengths (at least half the sequence) so attention masking is exercised.
        lengths = torch.randint(seq // 2, seq + 1, (batch_size,), generator=g)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        labels = torch.randint(0, p["num_labels"], (batch_size,), generator=g)
        return {k: v.to(device) for k, v in dict(input_ids=ids, attention_mask=mask, labels=labels).items()}

    def loss(self, model: nn.Module, inputs: Inputs) -> torch.Tensor:
        logits = model(inputs["input_ids"], inputs["attention_mask"])
        return F.cross_entropy(logits.float(), inputs["labels"])
