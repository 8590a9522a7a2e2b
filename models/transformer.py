"""BERT-style Transformer classifier: the seed's ``transformer`` workload.

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

from models.base import Inputs, Workload, batch_generator

if TYPE_CHECKING:  # transformers takes seconds to import: only building a model needs it
    from transformers import BertConfig

_BERT_BASE: dict[str, Any] = dict(
    vocab_size=30522,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    max_position_embeddings=512,
    seq_len=128,
    num_labels=2,
)


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


class TransformerWorkload(Workload):
    name = "transformer"
    lr = 2e-5
    presets = {
        "tiny": dict(
            _BERT_BASE,
            vocab_size=1024,
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=512,
            max_position_embeddings=128,
            seq_len=32,
        ),
        "small": dict(
            _BERT_BASE, hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048
        ),
        "base": dict(_BERT_BASE),
        "large": dict(
            _BERT_BASE, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
        ),
        # depth/width steps between the named shapes, so a max-size search resolves ~1.3x
        "h768-l18": dict(_BERT_BASE, num_hidden_layers=18),
        "h768-l24": dict(_BERT_BASE, num_hidden_layers=24),
        "h1024-l18": dict(
            _BERT_BASE, hidden_size=1024, num_hidden_layers=18, num_attention_heads=16, intermediate_size=4096
        ),
        "h1024-l32": dict(
            _BERT_BASE, hidden_size=1024, num_hidden_layers=32, num_attention_heads=16, intermediate_size=4096
        ),
        "h1024-l40": dict(
            _BERT_BASE, hidden_size=1024, num_hidden_layers=40, num_attention_heads=16, intermediate_size=4096
        ),
        "h1536-l24": dict(
            _BERT_BASE, hidden_size=1536, num_hidden_layers=24, num_attention_heads=16, intermediate_size=6144
        ),
        "h1536-l32": dict(
            _BERT_BASE, hidden_size=1536, num_hidden_layers=32, num_attention_heads=16, intermediate_size=6144
        ),
        "1b": dict(
            _BERT_BASE, hidden_size=2048, num_hidden_layers=24, num_attention_heads=32, intermediate_size=8192
        ),
        "h2048-l32": dict(
            _BERT_BASE, hidden_size=2048, num_hidden_layers=32, num_attention_heads=32, intermediate_size=8192
        ),
        "2.5b": dict(
            _BERT_BASE,
            hidden_size=2560,
            num_hidden_layers=32,
            num_attention_heads=32,
            intermediate_size=10240,
        ),
        "h3072-l32": dict(
            _BERT_BASE,
            hidden_size=3072,
            num_hidden_layers=32,
            num_attention_heads=32,
            intermediate_size=12288,
        ),
        "6b": dict(
            _BERT_BASE,
            hidden_size=4096,
            num_hidden_layers=30,
            num_attention_heads=32,
            intermediate_size=16384,
        ),
        "h4096-l40": dict(
            _BERT_BASE,
            hidden_size=4096,
            num_hidden_layers=40,
            num_attention_heads=32,
            intermediate_size=16384,
        ),
        "13b": dict(
            _BERT_BASE,
            hidden_size=5120,
            num_hidden_layers=40,
            num_attention_heads=40,
            intermediate_size=20480,
        ),
        "20b": dict(
            _BERT_BASE,
            hidden_size=6144,
            num_hidden_layers=44,
            num_attention_heads=48,
            intermediate_size=24576,
        ),
    }
    #: presets in increasing parameter count, for the max-size search (depth and width grow).
    ladder = (
        "tiny",
        "small",
        "base",
        "h768-l18",
        "h768-l24",
        "h1024-l18",
        "large",
        "h1024-l32",
        "h1024-l40",
        "h1536-l24",
        "h1536-l32",
        "1b",
        "h2048-l32",
        "2.5b",
        "h3072-l32",
        "6b",
        "h4096-l40",
        "13b",
        "20b",
    )

    def _config(self, preset: str, dropout: bool) -> tuple[BertConfig, dict[str, Any]]:
        from transformers import BertConfig

        self.check_preset(preset)
        p = dict(self.presets[preset])
        extra = {k: p.pop(k) for k in ("seq_len", "num_labels")}
        if not dropout:
            p.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return BertConfig(**p), extra

    def param_count(self, preset: str) -> int:
        """BERT's parameters from the preset's shape alone (tested equal to a meta-device build):
        the ladder and ``shardbench list`` need 19 counts up to 20B, and building each model, even
        on the meta device, costs seconds (transformers' import and init included)."""
        self.check_preset(preset)
        p = self.presets[preset]
        h, inter, labels = p["hidden_size"], p["intermediate_size"], p["num_labels"]
        embeddings = (
            p["vocab_size"] + p["max_position_embeddings"] + p.get("type_vocab_size", 2)
        ) * h + 2 * h
        attention = 4 * (h * h + h) + 2 * h  # q, k, v, output projection; LayerNorm
        mlp = (h * inter + inter) + (inter * h + h) + 2 * h  # up, down; LayerNorm
        pooler, head = h * h + h, h * labels + labels
        return embeddings + p["num_hidden_layers"] * (attention + mlp) + pooler + head

    def build(self, preset: str, *, dropout: bool = True) -> nn.Module:
        config, extra = self._config(preset, dropout)
        return BertClassifier(config, num_labels=extra["num_labels"], head_dropout=0.3 if dropout else 0.0)

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
