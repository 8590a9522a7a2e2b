"""Presets of the ``imagegpt`` workload (the Image GPT paper's shapes) and their parameter counts.

Here, not in ``models/imagegpt.py``, so that counting sizes imports neither torch nor
transformers (``shardbench list``, the size ladder). ``models.imagegpt.ImageGPTWorkload`` takes
``PRESETS``, ``LADDER`` and ``CLUSTERS`` from here; the tests check ``param_count`` against a
meta build.
"""

from __future__ import annotations

from typing import Any

#: colour clusters a pixel token takes; token ``CLUSTERS`` is the start token
CLUSTERS = 512

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(n_embd=64, n_layer=2, n_head=2, side=8),
    "igpt-s": dict(n_embd=512, n_layer=24, n_head=8, side=32),
    "igpt-m": dict(n_embd=1024, n_layer=36, n_head=8, side=32),
    "igpt-l": dict(n_embd=1536, n_layer=48, n_head=16, side=32),
}

#: width/depth steps for the max-size search, parameter counts increasing.
LADDER: tuple[str, ...] = ("tiny", "igpt-s", "igpt-m", "igpt-l")


def param_count(preset: dict[str, Any]) -> int:
    """Image GPT's parameters from the preset's shape alone: embeddings (513 tokens, side²
    positions), per layer two weight-only LayerNorms, attention (qkv + projection) and a 4x MLP,
    a final LayerNorm and the untied, bias-free head over the 512 clusters."""
    e, vocab, positions = preset["n_embd"], CLUSTERS + 1, preset["side"] * preset["side"]
    layer = 2 * e + (3 * e * e + 3 * e) + (e * e + e) + (4 * e * e + 4 * e) + (4 * e * e + e)
    return (vocab + positions) * e + preset["n_layer"] * layer + e + e * CLUSTERS
