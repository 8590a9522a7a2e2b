"""What every ``shardbench`` subcommand shares: the user-error type and list parsing."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

DEFAULT_RUNS_DIR = Path("results/runs")


def require_cuda_if(device: str) -> None:
    """Refuse ``--device cuda`` on a machine without CUDA, before anything starts."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda requested but CUDA is not available here; use --device cpu")


class UsageError(ValueError):
    """A user mistake: reported in one line with exit code 2."""


def csv_list(kind: type) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        try:
            return tuple(kind(t) for t in items)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {kind.__name__}s, got {text!r}"
            ) from None

    return parse


def tag_pair(text: str) -> tuple[str, str]:
    """``key=value`` for ``--tag``: a key of letters, digits, '-', '_' or '.', any value."""
    key, sep, value = text.partition("=")
    if not sep or not key or not key.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE with a key of letters, digits, '-', '_' or '.', got {text!r}"
        )
    return key, value
