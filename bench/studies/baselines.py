"""Saved baselines: a run's records kept under ``<home>/baselines/<device>/<NAME>.jsonl`` (the
home: ``--root``, else ``$SHARDBENCH_HOME``, else ``./results``)
with a manifest saying who saved them, when, from which commit and run, on what environment.
One name may hold records of several machines (``--add``); ``compare`` reads those of its own.

A baseline is data in the repository, never constants in code: a new one is a reviewed commit
(``shardbench baseline save RUN --as NAME``), and ``compare`` / ``nightly`` name it. The device
folder (``cpu``, ``cuda``) keeps one name usable for both kinds of machine.
"""

from __future__ import annotations

import getpass
import json
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shardbench.paths import atomic_write_text, file_lock, inside, path_component, results_home
from shardbench.records import Record, load_records, none_ok, records_file
from shardbench.studies.machines import describe, machine_of, machines
from shardbench.wording import program

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def baselines_dir(home: Path | None = None) -> Path:
    """The baselines folder of ``home`` (``paths.results_home``)."""
    return results_home(home) / "baselines"


def check_baseline_name(name: str) -> None:
    if not NAME_PATTERN.match(name):
        raise ValueError(
            f"baseline name {name!r}: use letters, digits, '.', '-' and '_' (not starting with '.' or '-')"
        )


def save_baseline(
    runs: Sequence[Path],
    name: str,
    *,
    root: Path | None = None,
    force: bool = False,
    add: bool = False,
    strict: bool = False,
) -> Path:
    """Save the records of ``runs`` (one or more runs of the same suite, e.g. three nights) as
    ``root/<device>/<name>.jsonl`` beside a manifest; returns the records path. Several runs make
    a better baseline: their spread is the run-to-run noise a night is judged against. Refuses to
    overwrite an existing baseline unless ``force`` (replace it whole) or ``add``: keep its
    records of other machines (``machines.py``) and replace those of the runs' machine, so one
    name serves every kind of machine a CI fleet has.

    The file is built from the parsed records (one per line, whatever the sources' last lines
    looked like; a line that is not a record is named and skipped), written to a temporary file
    and renamed over the old one, under a lock: a full disk or a second save at the same time
    leaves the old baseline whole, never a mixture."""
    check_baseline_name(name)
    root = Path(root or baselines_dir())
    if root.exists() and not root.is_dir():
        raise ValueError(f"baseline root {root} is not a directory")
    sources = [records_file(run) for run in runs]
    records = [r for source in sources for r in load_records(source, strict=strict)]
    if failed := none_ok(records):
        raise ValueError(
            f"{', '.join(map(str, sources))}: {failed}; a baseline of failed cells would let every night "
            "pass against it (nothing in it can regress): save runs whose cells ran"
        )
    devices = sorted({r.device for r in records})
    if len(devices) != 1:
        raise ValueError(f"records from several devices ({', '.join(devices)}); save one baseline per device")
    if force and add:
        raise ValueError("--force replaces the whole baseline, --add keeps other machines' records: give one")
    folder = inside(root, path_component(devices[0], what="the records' device"))
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / f"{name}.jsonl"
    with file_lock(dest):
        if dest.exists() and not force:
            if not add:
                raise ValueError(
                    f"baseline {dest} exists; pass --add to keep its records of other machines and replace "
                    "this machine's, or --force to replace it whole (the old one stays in git history)"
                )
            new = set(machines(records))
            records = [r for r in load_records(dest) if machine_of(r) not in new] + records
        text = "".join(json.dumps(r.to_json(), sort_keys=True, allow_nan=False) + "\n" for r in records)
        meta = json.dumps(manifest(records, sources), indent=1, sort_keys=True) + "\n"
        atomic_write_text(dest, text)
        atomic_write_text(manifest_path(dest), meta)
    return dest


def manifest_path(records: Path) -> Path:
    return records.with_suffix(".manifest.json")


def manifest(records: list[Record], sources: Sequence[Path]) -> dict[str, Any]:
    """What the baseline holds: the whole, and each machine's records (``environment``: the
    machine saved last)."""
    envs = [r.env for r in records]
    last = records[-1].env
    return {
        "saved_by": getpass.getuser(),
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "sources": [str(source) for source in sources],
        "run_ids": sorted({r.run_id for r in records}),
        "names": sorted({r.name for r in records if r.name}),
        "records": len(records),
        "ok": sum(r.status == "ok" for r in records),
        "schema": sorted({r.schema for r in records}),
        "git_sha": sorted({e.get("git_sha") for e in envs}, key=str),
        "environment": _environment(last),
        "machines": [
            {
                "machine": describe(m),
                "environment": _environment(held[-1].env),
                "records": len(held),
                "run_ids": sorted({r.run_id for r in held}),
                "git_sha": sorted({r.env.get("git_sha") for r in held}, key=str),
            }
            for m in machines(records)
            for held in [[r for r in records if machine_of(r) == m]]
        ],
    }


#: the environment facts a manifest lists
MANIFEST_ENV = ("torch", "cuda", "python", "platform", "device_name", "cpu_model", "cpu_count")


def _environment(env: dict[str, Any]) -> dict[str, Any]:
    return {k: env.get(k) for k in MANIFEST_ENV}


def find_baseline(name: str, *, device: str | None = None, root: Path | None = None) -> Path:
    """The records of the baseline ``name``; ``device`` picks between a cpu and a cuda one."""
    check_baseline_name(name)
    root = root or baselines_dir()
    found = sorted(root.glob(f"*/{name}.jsonl"))
    if device is not None:
        found = [p for p in found if p.parent.name == device] or found
    if len(found) == 1:
        return found[0]
    saved = sorted(f"{p.parent.name}/{p.stem}" for p in root.glob("*/*.jsonl"))
    if not found:
        listed = ", ".join(saved) or "none yet"
        raise ValueError(
            f"no baseline named {name!r} under {root} (saved: {listed}); "
            f"save one with: {program()} baseline save RUN --as {name}"
        )
    raise ValueError(f"baseline {name!r} exists for several devices ({', '.join(str(p) for p in found)})")


def resolve_source(text: str, *, device: str | None = None, root: Path | None = None) -> Path:
    """``compare``'s argument: a run directory, a records file, or a saved baseline's name."""
    path = Path(text)
    if path.exists():
        return records_file(path)
    if NAME_PATTERN.match(text) and "/" not in text:
        return find_baseline(text, device=device, root=root)
    raise ValueError(f"{text}: not a run directory, a records file or a saved baseline name")
