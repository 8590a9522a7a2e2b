"""Which processes are alive: for tests that assert no rank outlives a run."""

from __future__ import annotations

import os
from pathlib import Path


def worker_processes(marker: str = "bench.harness.worker") -> list[int]:
    """PIDs of live processes whose command line, or whose standard output's path, contains
    ``marker`` (zombies excluded). Ranks forked by the launcher's fork server keep the server's
    command line, but their output goes to a log in the cell's temporary directory."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        try:
            stdout = os.readlink(proc / "fd" / "1")
        except OSError:
            stdout = ""
        if (marker in cmdline or marker in stdout) and state != "Z":
            pids.append(int(proc.name))
    return pids
