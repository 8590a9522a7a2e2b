"""Presets of the ``swav`` workload (SwAV's RN50-wN) and their parameter counts.

Here, not in ``models/swav.py``, so that counting sizes imports neither torch nor torchvision
(``shardbench list``, the size ladder): without a formula the count builds the model on the
meta device. ``shardbench.models.swav.SwAVWorkload`` takes ``PRESETS`` and ``LADDER`` from here; the tests
check ``param_count`` against a meta build of every preset.
"""

from __future__ import annotations

import math
from typing import Any

from shardbench.models.presets.family import Presets, SizeFamily

NAMED: dict[str, dict[str, Any]] = {
    "tiny": dict(width=8, hidden=64, feat_dim=16, prototypes=30, crops=(2, 32, 2, 16)),
    "rn50": dict(width=64, hidden=2048, feat_dim=128, prototypes=3000, crops=(2, 224, 6, 96)),
    "rn50-w2": dict(width=128, hidden=2048, feat_dim=128, prototypes=3000, crops=(2, 224, 6, 96)),
    "rn50-w4": dict(width=256, hidden=2048, feat_dim=128, prototypes=3000, crops=(2, 224, 6, 96)),
    "rn50-w5": dict(width=320, hidden=2048, feat_dim=128, prototypes=3000, crops=(2, 224, 6, 96)),
}

LADDER: tuple[str, ...] = ("tiny", "rn50", "rn50-w2", "rn50-w4", "rn50-w5")

#: blocks per stage of ResNet-50, and torchvision's Bottleneck expansion
DEPTHS, _EXPANSION = (3, 4, 6, 3), 4


def depths(preset: dict[str, Any]) -> tuple[int, int, int, int]:
    """Bottlenecks per stage: ResNet-50's, with the third stage at ``stage3`` blocks where the
    preset says (ResNet-101 is the same with 23)."""
    return (*DEPTHS[:2], preset.get("stage3", DEPTHS[2]), DEPTHS[3])


def _bottleneck(inplanes: int, planes: int) -> int:
    """torchvision's Bottleneck (groups 1, base width 64): bias-free 1x1, 3x3 and 1x1 convs, each
    followed by a BatchNorm (weight + bias; running stats are buffers)."""
    out = planes * _EXPANSION
    return inplanes * planes + 2 * planes + 9 * planes * planes + 2 * planes + planes * out + 2 * out


def param_count(preset: dict[str, Any]) -> int:
    """The width-scaled ResNet-50 trunk (``shardbench.models.swav.WideResNet50Trunk``), the projection head
    (Linear, BatchNorm1d, Linear) and the bias-free prototypes, from the preset's shape alone."""
    width = preset["width"]
    total = 3 * width * 7 * 7 + 2 * width  # stem: 7x7 conv without bias, BatchNorm
    inplanes = width
    for i, depth in enumerate(depths(preset)):
        planes = width * 2**i
        out = planes * _EXPANSION
        # the first block of every stage changes channels (and, after the first, strides): a
        # 1x1 bias-free conv + BatchNorm downsample
        total += inplanes * out + 2 * out
        for _ in range(depth):
            total += _bottleneck(inplanes, planes)
            inplanes = out
    hidden, feat = preset["hidden"], preset["feat_dim"]
    projection = (inplanes * hidden + hidden) + 2 * hidden + (hidden * feat + feat)
    return total + projection + feat * preset["prototypes"]


def family_config(width: int, stage3: int) -> dict[str, Any]:
    """RN50-w at any stem width and third-stage depth, with rn50's head and crops (rn50 is
    w64-s6, ResNet-101's depth s23). ResNet-50's depth is left implicit, as the named presets
    leave it, so ``rn50-w2`` and ``w128-s6`` are the same preset."""
    config = dict(NAMED["rn50"], width=width)
    return config if stage3 == DEPTHS[2] else dict(config, stage3=stage3)


#: trunk width in steps of 8 channels, 2 to 24 third-stage blocks (ResNet-50: 6, -101: 23);
#: width alone steps by 13-55% at these sizes, the depth fills between, nearest 6 first
FAMILY = SizeFamily(
    spelling="w{width}-s{stage3}",
    knobs={"width": range(8, 1025, 8), "stage3": range(2, 25)},
    distance=lambda width, stage3: abs(math.log(stage3 / DEPTHS[2])),
    config=family_config,
    param_count=param_count,
    described="rn50's projection head, prototypes and multi-crop",
)
PRESETS = Presets(NAMED, FAMILY)
