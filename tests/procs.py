"""Which processes are alive: for tests that assert no rank outlives a run."""

from __future__ import annotations

import os
from pathlib import Path


def worker_processes(marker: str = "shardbench.harness.worker") -> list[int]:
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


def descendants(pid: int) -> list[int]:
    """PIDs of the live processes below ``pid`` (children, theirs, ...), zombies excluded."""
    parents: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(proc.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found += children
        frontier += children
    return found


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (not zombies)."""
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out


def with_environment(name: str, value: str) -> list[int]:
    """PIDs of live processes started with ``name=value`` in their environment (zombies
    excluded): every process a command started, forked or exec'd, inherits a marker set for it."""
    wanted = f"{name}={value}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if wanted in environ and state != "Z":
            pids.append(int(proc.name))
    return pids
