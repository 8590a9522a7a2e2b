"""DeepSpeech2, as in deepspeech.pytorch's defaults: two Conv2d layers (32 channels; 41x11
stride 2x2, then 21x11 stride 2x1) each with BatchNorm and Hardtanh(0, 20), five bidirectional
LSTMs (hidden 1024, directions summed) with sequence-wise BatchNorm between them, a
sequence-wise BatchNorm + linear layer to 29 characters, and CTC loss (~86.6M parameters).

Inputs are log spectrograms from torchaudio (161 frequency bins: 20 ms window, 10 ms hop at
16 kHz) of synthetic waveforms of varying length (generated in memory: no audio files, no
torchcodec), padded, with the true frame counts carried to packing and to the CTC loss.
Optimizer: AdamW (deepspeech.pytorch's default is AdamW too).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torchaudio
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from shardbench.models.base import BuiltinWorkload, Inputs, batch_generator
from shardbench.models.presets import deepspeech2 as presets_module
from shardbench.models.presets.deepspeech2 import CHARS, FREQ_BINS

SAMPLE_RATE, WINDOW, HOP = 16_000, 320, 160  # 20 ms / 10 ms at 16 kHz: FREQ_BINS = WINDOW // 2 + 1


def _spectrogram(wave: torch.Tensor) -> torch.Tensor:
    """Magnitude spectrogram, 161 bins (20 ms Hann window, 10 ms hop): torchaudio's function,
    not its module, so a module-tracking memory tracker does not see data preparation."""
    return torchaudio.functional.spectrogram(
        wave,
        pad=0,
        window=torch.hann_window(WINDOW),
        n_fft=WINDOW,
        hop_length=HOP,
        win_length=WINDOW,
        power=1.0,
        normalized=False,
    )


class BatchRNN(nn.Module):
    """Sequence-wise BatchNorm (over time x batch) then a bidirectional LSTM, directions summed."""

    def __init__(self, input_size: int, hidden: int, batch_norm: bool) -> None:
        super().__init__()
        self.batch_norm = nn.BatchNorm1d(input_size) if batch_norm else None
        self.rnn = nn.LSTM(input_size, hidden, bidirectional=True)
        self.hidden = hidden

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        t, n, _ = x.shape
        if self.batch_norm is not None:
            x = self.batch_norm(x.reshape(t * n, -1)).view(t, n, -1)
        packed = pack_padded_sequence(x, lengths.cpu(), enforce_sorted=False)
        # ``rnn.forward``, not ``rnn(...)``: module hooks (PyTorch's MemTracker) re-build the
        # PackedSequence output and fail on it; the LSTM's parameters are tracked regardless.
        x, _ = pad_packed_sequence(self.rnn.forward(packed)[0], total_length=t)
        return x.view(t, n, 2, self.hidden).sum(dim=2)


class DeepSpeech2(nn.Module):
    def __init__(self, hidden: int, layers: int, channels: int = 32, freq_bins: int = FREQ_BINS) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, channels, (41, 11), (2, 2), (20, 5)),
            nn.BatchNorm2d(channels),
            nn.Hardtanh(0, 20),
            nn.Conv2d(channels, channels, (21, 11), (2, 1), (10, 5)),
            nn.BatchNorm2d(channels),
            nn.Hardtanh(0, 20),
        )
        freq = (freq_bins + 2 * 20 - 41) // 2 + 1
        freq = (freq + 2 * 10 - 21) // 2 + 1
        sizes = [freq * channels] + [hidden] * (layers - 1)
        self.rnns = nn.ModuleList(BatchRNN(s, hidden, batch_norm=i > 0) for i, s in enumerate(sizes))
        self.out_norm = nn.BatchNorm1d(hidden)
        self.fc = nn.Linear(hidden, CHARS, bias=False)

    @staticmethod
    def output_lengths(frames: torch.Tensor) -> torch.Tensor:
        return (frames + 2 * 5 - 11) // 2 + 1  # only the first conv strides in time

    def forward(self, spec: torch.Tensor, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """spec: N x 1 x F x T -> log-probabilities T' x N x CHARS and their lengths."""
        x = self.conv(spec)
        n, c, f, t = x.shape
        x = x.view(n, c * f, t).permute(2, 0, 1).contiguous()  # T x N x features
        lengths = self.output_lengths(frames)
        for rnn in self.rnns:
            x = rnn(x, lengths)
        x = self.fc(self.out_norm(x.reshape(t * n, -1))).view(t, n, -1)
        return F.log_softmax(x.float(), dim=-1), lengths


class DeepSpeech2Workload(BuiltinWorkload):
    name = "deepspeech2"
    lr = 3e-4
    shapes = presets_module
    presets = presets_module.PRESETS
    ladder = presets_module.LADDER
    not_plannable = (
        "its clips have random lengths and pack_padded_sequence sizes the LSTM's work from their "
        "values, which fake tensors do not have; use --simulate (real memory, one process)"
    )

    def build(self, preset: str, *, dropout: bool = True) -> nn.Module:
        self.check_preset(preset)
        p = self.presets[preset]
        return DeepSpeech2(p["hidden"], p["layers"], p["channels"])

    def checkpoint_units(self, model: nn.Module) -> list[nn.Module]:
        """The convolution block and each recurrent layer (sequence-wise BatchNorm + LSTM):
        the units whose outputs the next one takes, with their BatchNorm statistics kept from
        counting the batch twice by ``shardbench.models.checkpointing``."""
        assert isinstance(model, DeepSpeech2)
        return [model.conv, *model.rnns]

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
        p = self.presets[preset]
        g = batch_generator(seed=seed, step=step, rank=rank)
        lo, hi = (int(s * SAMPLE_RATE) for s in p["seconds"])
        samples = torch.randint(lo, hi + 1, (batch_size,), generator=g)
        specs, frames = [], []
        for n in samples.tolist():
            wave = torch.randn(n, generator=g) * 0.1
            spec = torch.log1p(_spectrogram(wave))  # 161 x frames
            specs.append((spec - spec.mean()) / (spec.std() + 1e-5))
            frames.append(spec.shape[1])
        t = max(frames)
        padded = torch.stack([F.pad(s, (0, t - s.shape[1])) for s in specs]).unsqueeze(1)
        frames_t = torch.tensor(frames)
        out_len = DeepSpeech2.output_lengths(frames_t)
        target_len = torch.minimum(
            torch.randint(1, p["max_chars"] + 1, (batch_size,), generator=g), out_len // 2
        )
        targets = torch.randint(1, CHARS, (int(target_len.sum()),), generator=g)  # 0 is the blank
        return {
            k: v.to(device)
            for k, v in dict(spec=padded, frames=frames_t, targets=targets, target_lengths=target_len).items()
        }

    def loss(self, model: nn.Module, inputs: Inputs) -> torch.Tensor:
        log_probs, lengths = model(inputs["spec"], inputs["frames"])
        return F.ctc_loss(
            log_probs,
            inputs["targets"],
            lengths,
            inputs["target_lengths"],
            blank=0,
            reduction="mean",
            zero_infinity=True,
        )
