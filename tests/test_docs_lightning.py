"""docs/lightning.md's comparison names the command that measured its shardbench rows: the one
``scripts/measure_lightning.py`` runs (the example GPT, not the default suite)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script_run_flags() -> dict[str, str]:
    """The workload, strategies and world size ``scripts/measure_lightning.py`` runs."""
    text = (ROOT / "scripts/measure_lightning.py").read_text()
    pairs = re.findall(r'"(--workload|--strategy|--world-size)",\s*"([^"]+)"', text)
    return dict(pairs)


def test_the_comparison_names_the_command_that_measured_it() -> None:
    text = (ROOT / "docs/lightning.md").read_text()
    section = text[text.index("## Does zero2 keep its saving inside Lightning?") :]
    section = " ".join(section[: section.index("| measured by")].split())
    (command,) = re.findall(r"`(\.venv/bin/shardbench run [^`]+)`", section)
    flags = _script_run_flags()
    assert set(flags) == {"--workload", "--strategy", "--world-size"}
    assert [f"{flag} {value}" for flag, value in flags.items() if f"{flag} {value}" not in command] == []
