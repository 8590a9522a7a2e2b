"""A results-home cache for this machine's probes (the GEMM peak's, ``peaks``; the network's,
``gloo_probe``; the optimizer update's, ``update_probe``): one JSON file per probe under
``<home>/peaks/``, keyed by what makes two probes the same measurement. A probe runs once per key;
a probe another process finished first stays, so a key has one figure. An unreadable cache reads
as empty (measured again). Imports no torch."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardbench.paths import atomic_write_text, file_lock, results_home


def cache_path(name: str, home: Path | None = None) -> Path:
    return results_home(home) / "peaks" / f"{name}.json"


def read(name: str, home: Path | None = None) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(cache_path(name, home).read_text())
    except (OSError, ValueError):
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    return {k: v for k, v in (entries or {}).items() if isinstance(v, dict)}


def cached(
    name: str, key: str, measure: Callable[[], dict[str, Any]], home: Path | None = None
) -> dict[str, Any]:
    """The entry cached under ``key``, or ``measure()``'s (with ``measured_at``), stored."""
    entry = read(name, home).get(key)
    if entry is not None:
        return entry
    entry = {**measure(), "key": key, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    path = cache_path(name, home)
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path):
        entries = read(name, home)
        kept = entries.setdefault(key, entry)
        atomic_write_text(
            path, json.dumps({"version": 1, "entries": entries}, indent=1, sort_keys=True) + "\n"
        )
    return kept
