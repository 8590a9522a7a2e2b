"""Which processes are alive: for tests that assert no rank outlives a run."""

from __future__ import annotations

import os
from pathlib import Path


def worker_processes(marker: str = "bench.harness.worker") -> list[int]:
    """PIDs of live processes whose command line contains ``marker`` (zombies excluded)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            pids.append(int(proc.name))
    return pids
