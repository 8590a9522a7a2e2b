"""The result record: one JSON object per cell, appended to ``records.jsonl``.

Tables, plots and baselines are built only from records, never from live objects, so a record
must say everything needed to interpret it: what ran (cell), how the strategy was configured,
what was measured (time, memory and its breakdown), what theory predicted, and where (env).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("ok", "oom", "error", "timeout", "skipped")


@dataclass
class Record:
    run_id: str
    suite: str
    workload: str
    preset: str
    params: int
    strategy: str
    world_size: int
    requested_world_size: int
    simulated: bool
    backend: str
    device: str
    precision: str
    batch_size_per_rank: int
    steps: int
    warmup: int
    status: str
    error: str | None = None
    note: str = ""
    strategy_settings: dict[str, Any] = field(default_factory=dict)
    step_time_s: dict[str, float] | None = None
    samples_per_s: float | None = None
    peak_mem_bytes: dict[str, Any] | None = None  # {"per_rank": [...], "max": int, "source": str}
    mem_breakdown_bytes: dict[str, int] | None = None  # of the peak rank, at its peak
    cuda_allocator: dict[str, int] | None = None  # of the peak rank
    predicted_mem_bytes: dict[str, int] | None = None
    #: params/grads/optimizer held after a step (before the next zero_grad), with their total:
    #: what the analytic prediction is compared with (of the peak rank)
    model_state_bytes: dict[str, int] | None = None
    #: planned under FakeTensorMode: memory is what the tracker saw allocated, none was
    fake: bool = False
    #: only on ``shardbench max-size`` summary records (suite "max-size"); see bench/studies/maxsize.py
    max_size: dict[str, Any] | None = None
    loss: dict[str, float] | None = None  # {"first", "last"}, rank 0
    wall_s: float | None = None
    env: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert self.status in STATUSES, f"bad status {self.status!r}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> Record:
        known = Record.__dataclass_fields__
        return Record(**{k: v for k, v in d.items() if k in known})


def append_record(path: Path, record: Record) -> None:
    """Append one record and flush, so a crash later in the run loses nothing written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record.to_json(), sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_records(paths: Iterable[Path]) -> list[Record]:
    """Read records from JSONL files (or run directories holding ``records.jsonl``)."""
    out: list[Record] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            p = p / "records.jsonl"
        with p.open() as f:
            out.extend(Record.from_json(json.loads(line)) for line in f if line.strip())
    return out


def first_line(text: str | None, limit: int = 120) -> str:
    """The first non-empty line of an error, for one-line table cells."""
    lines = (text or "").strip().splitlines()
    return lines[0][:limit] if lines else ""


def _git_sha() -> str | None:
    try:
        root = Path(__file__).resolve().parent.parent
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def capture_env(device: str) -> dict[str, Any]:
    """Versions and hardware the numbers depend on."""
    import torch

    env: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "host": socket.gethostname(),
        "git_sha": _git_sha(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device_name": platform.processor() or platform.machine(),
    }
    if device == "cuda" and torch.cuda.is_available():
        env["device_name"] = torch.cuda.get_device_name(0)
        env["device_count"] = torch.cuda.device_count()
    return env
