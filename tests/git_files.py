"""Which files git would show a user as untracked in the checkout: what a command writes by
default must be ignored, or written where the user chose to commit it."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def not_ignored(paths: list[Path]) -> list[str]:
    """Those of ``paths`` (relative to the checkout), in order, that git would list as untracked."""
    names = [str(p) for p in paths]
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"],
        input="\n".join(names) + "\n", cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    return [n for n in names if n not in done.stdout.splitlines()]
