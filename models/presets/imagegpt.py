"""Presets of the ``imagegpt`` workload (the Image GPT paper's shapes) and their parameter counts.

Here, not in ``models/imagegpt.py``, so that counting sizes imports neither torch nor
transformers (``shardbench list``, the size ladder). ``shardbench.models.imagegpt.ImageGPTWorkload`` takes
``PRESETS``, ``LADDER`` and ``CLUSTERS`` from here; the tests check ``param_count`` against a
meta build.
"""

from __future__ import annotations

import math
from typing import Any

from shardbench.models.presets.family import Presets, SizeFamily

#: colour clusters a pixel token takes; token ``CLUSTERS`` is the start token
CLUSTERS = 512

NAMED: dict[str, dict[str, Any]] = {
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


def family_config(n_embd: int, n_layer: int) -> dict[str, Any]:
    """Image GPT at another width and depth: 64-dim heads, 32x32 images (igpt-s is e512-l24)."""
    return dict(n_embd=n_embd, n_layer=n_layer, n_head=n_embd // 64, side=32)


#: width in steps of one 64-dim head, depth in blocks; a search walks the shapes with 8 to 64
#: dims per block (iGPT-S/M/L have 21-32), nearest 24 first
FAMILY = SizeFamily(
    spelling="e{n_embd}-l{n_layer}",
    knobs={"n_embd": range(64, 4097, 64), "n_layer": range(1, 97)},
    config=family_config,
    param_count=param_count,
    in_band=lambda n_embd, n_layer: 8 <= n_embd / n_layer <= 64,
    distance=lambda n_embd, n_layer: abs(math.log(n_embd / n_layer / 24)),
    described="64-dim heads, 32x32 images",
)
PRESETS = Presets(NAMED, FAMILY)
