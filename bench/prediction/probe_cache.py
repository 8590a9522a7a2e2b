"""A results-home cache for this machine's probes (the GEMM peak's, ``peaks``; the network's,
``gloo_probe``; the optimizer update's, ``update_probe``; a step's replay): one JSON file per probe
under ``<home>/peaks/``, keyed by what makes two probes the same measurement. An unreadable cache
reads as empty (measured again).

A probe measured while other work kept the cores busy reads the machine slow, and a first figure
kept forever would then misstate every later prediction and MFU. So each entry says how busy the
machine was as it was measured (``load_per_core``: the 1-minute load average over the cores,
read before the probe starts, so the probe's own threads are not in it), and one measured busy
(``BUSY_LOAD`` or more) is provisional: the next lookup on a quiet machine measures again and
keeps the quiet figure. A quiet figure is never replaced by a busy one; between two quiet ones
the first stays, so a key has one figure. ``shardbench env --remeasure`` drops them all.
Imports no torch."""

from __future__ import annotations

import json
import os
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


#: the load per core from which a machine counts as busy: every core has a runnable thread
#: beside the probe's own
BUSY_LOAD = 1.0


def load_per_core() -> float | None:
    """The 1-minute load average over the cores this process may use (None where unknown)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    try:
        return os.getloadavg()[0] / max(1, cores)
    except OSError:
        return None


def busy(entry: dict[str, Any]) -> bool:
    """Whether ``entry`` was measured on a busy machine, or under a load it does not record
    (provisional: a quiet figure replaces it). A load this machine could not read is taken as
    quiet: it can never be known better."""
    if "load_per_core" not in entry:  # cached before loads were recorded: unknown, so provisional
        return True
    load = entry["load_per_core"]
    return load is not None and load >= BUSY_LOAD


def cached(
    name: str,
    key: str,
    measure: Callable[[], dict[str, Any]],
    home: Path | None = None,
    load: Callable[[], float | None] = load_per_core,
) -> dict[str, Any]:
    """The entry cached under ``key``, or ``measure()``'s (with ``measured_at`` and the load it
    was measured under), stored; a busy entry is measured again when the machine is quiet."""
    entry = read(name, home).get(key)
    now = load()
    quiet_now = now is None or now < BUSY_LOAD
    if entry is not None and not (busy(entry) and quiet_now):
        return entry
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    fresh = {**measure(), "key": key, "measured_at": stamp, "load_per_core": now}
    path = cache_path(name, home)
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path):
        entries = read(name, home)
        held = entries.get(key)
        if held is None or (busy(held) and not busy(fresh)):
            entries[key] = fresh
        atomic_write_text(
            path, json.dumps({"version": 1, "entries": entries}, indent=1, sort_keys=True) + "\n"
        )
    return entries[key]


#: the caches of this module, as the probes name them
NAMES = ("network", "update", "compute")


def listing(home: Path | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """Every cached figure, by cache and key, with when and under what load it was measured
    (``shardbench env``); lists (a figure's per-repeat or per-copy values) are left out."""
    return {
        name: {
            key: {k: v for k, v in entry.items() if k != "key" and not isinstance(v, list)}
            for key, entry in read(name, home).items()
        }
        for name in NAMES
    }


def forget_all(home: Path | None = None) -> list[Path]:
    """Drop every cached probe of the results home (each is measured again when next needed)."""
    folder = results_home(home) / "peaks"
    gone = sorted(folder.glob("*.json")) if folder.is_dir() else []
    for f in gone:
        f.unlink()
    return gone
