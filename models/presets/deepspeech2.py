"""Presets of the ``deepspeech2`` workload and their parameter counts.

Here, not in ``models/deepspeech2.py``, so that counting sizes imports neither torch nor
torchaudio (``shardbench list``, the size ladder): without a formula the count builds the model
on the meta device. ``shardbench.models.deepspeech2`` takes ``PRESETS``, ``LADDER``, ``CHARS`` and
``FREQ_BINS`` from here; the tests check ``param_count`` against a meta build of every preset.
"""

from __future__ import annotations

import math
from typing import Any

from shardbench.models.presets.family import Presets, SizeFamily

#: output characters (the CTC blank + 28), and frequency bins of the input spectrogram (a
#: 320-sample window: 320 // 2 + 1)
CHARS, FREQ_BINS = 29, 161

NAMED: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden=64, layers=2, channels=8, seconds=(0.15, 0.25), max_chars=4),
    "paper": dict(hidden=1024, layers=5, channels=32, seconds=(1.0, 2.0), max_chars=20),
    "h1536": dict(hidden=1536, layers=5, channels=32, seconds=(1.0, 2.0), max_chars=20),
    "h2048-l7": dict(hidden=2048, layers=7, channels=32, seconds=(1.0, 2.0), max_chars=20),
}

LADDER: tuple[str, ...] = ("tiny", "paper", "h1536", "h2048-l7")


def _conv_freq(freq_bins: int = FREQ_BINS) -> int:
    """Frequency rows left after the two convolutions (41 and 21 tall, padding 20 and 10, both
    stride 2 in frequency): 161 bins -> 81 -> 41."""
    freq = (freq_bins + 2 * 20 - 41) // 2 + 1
    return (freq + 2 * 10 - 21) // 2 + 1


def _bilstm(input_size: int, hidden: int) -> int:
    """One bidirectional single-layer ``nn.LSTM``: per direction four gates' input and hidden
    weights and two biases (``bias_ih``, ``bias_hh``)."""
    return 2 * (4 * hidden * input_size + 4 * hidden * hidden + 2 * 4 * hidden)


def param_count(preset: dict[str, Any]) -> int:
    """``shardbench.models.deepspeech2.DeepSpeech2`` from the preset's shape alone: two Conv2d with bias,
    each followed by a BatchNorm2d (weight + bias; running stats are buffers); ``layers``
    bidirectional LSTMs, the first over the conv features (no BatchNorm before it), the others
    over ``hidden`` with a BatchNorm1d before each; an output BatchNorm1d and a bias-free linear
    layer to the characters."""
    hidden, layers, c = preset["hidden"], preset["layers"], preset["channels"]
    conv = (c * 41 * 11 + c) + 2 * c + (c * c * 21 * 11 + c) + 2 * c
    rnns = _bilstm(_conv_freq() * c, hidden) + (layers - 1) * (2 * hidden + _bilstm(hidden, hidden))
    return conv + rnns + 2 * hidden + hidden * CHARS


def family_config(hidden: int, layers: int) -> dict[str, Any]:
    """DeepSpeech2 at another hidden size and depth, with the paper preset's input (1-2 s clips,
    32 conv channels); ``paper`` is h1024-l5."""
    return dict(NAMED["paper"], hidden=hidden, layers=layers)


#: hidden size in steps of 32, 2 to 10 bidirectional LSTM layers (the paper used 3-7), nearest 5
#: first (8 layers at most left a 3.4% gap at 87M, DDP's answer in the CPU claim). An LSTM
#: has no head size to respect, and steps of 64 left 3.2-3.9% gaps at 99-290M parameters (the
#: CPU claim's sizes), wider than a 3% search
FAMILY = SizeFamily(
    spelling="h{hidden}-l{layers}",
    knobs={"hidden": range(32, 4097, 32), "layers": range(2, 11)},
    distance=lambda hidden, layers: abs(math.log(layers / NAMED["paper"]["layers"])),
    config=family_config,
    param_count=param_count,
    described="the paper preset's clips and convolutions",
)
PRESETS = Presets(NAMED, FAMILY)
