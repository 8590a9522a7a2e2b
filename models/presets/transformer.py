"""Presets of the ``transformer`` workload (BERT shapes) and their parameter counts.

Here, not in ``models/transformer.py``, so that counting sizes imports neither torch nor
transformers: ``shardbench list`` and the size ladder need 19 counts up to 20B, and building
each model, even on the meta device, costs seconds. ``shardbench.models.transformer.TransformerWorkload``
takes ``PRESETS`` and ``LADDER`` from here; the tests check ``param_count`` against a meta build.
"""

from __future__ import annotations

import math
from typing import Any

from shardbench.models.presets.family import Presets, SizeFamily

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

NAMED: dict[str, dict[str, Any]] = {
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
LADDER: tuple[str, ...] = (
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


def param_count(preset: dict[str, Any]) -> int:
    """BERT encoder + pooler + our linear head, from the preset's shape alone: embeddings (word,
    position, token type; LayerNorm), per layer attention (q, k, v, output; LayerNorm) and MLP
    (up, down; LayerNorm), the pooler and the head."""
    p = preset
    h, inter, labels = p["hidden_size"], p["intermediate_size"], p["num_labels"]
    embeddings = (p["vocab_size"] + p["max_position_embeddings"] + p.get("type_vocab_size", 2)) * h + 2 * h
    attention = 4 * (h * h + h) + 2 * h  # q, k, v, output projection; LayerNorm
    mlp = (h * inter + inter) + (inter * h + h) + 2 * h  # up, down; LayerNorm
    pooler, head = h * h + h, h * labels + labels
    return embeddings + p["num_hidden_layers"] * (attention + mlp) + pooler + head


def family_config(hidden: int, layers: int) -> dict[str, Any]:
    """bert-base at another width and depth: 64-dim heads, a 4x MLP, its vocabulary and sequence."""
    return dict(
        _BERT_BASE,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        intermediate_size=4 * hidden,
    )


#: width in steps of one 64-dim head, depth in layers; a search walks the shapes with 24 to 160
#: dims per layer (bert-base 64, bert-large 43, the 1b-20b presets 80-140), nearest 64 first
FAMILY = SizeFamily(
    spelling="h{hidden}-l{layers}",
    knobs={"hidden": range(128, 8193, 64), "layers": range(1, 97)},
    config=family_config,
    param_count=param_count,
    in_band=lambda hidden, layers: 24 <= hidden / layers <= 160,
    distance=lambda hidden, layers: abs(math.log(hidden / layers / 64)),
    described="bert-base's vocabulary and sequence, 64-dim heads, a 4x MLP",
)
PRESETS = Presets(NAMED, FAMILY)
