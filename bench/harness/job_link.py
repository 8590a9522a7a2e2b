"""One process's connection to the rest of its job: the store they share, who runs where, and
whether each is still alive.

The store is torch's TCPStore at the job's MASTER_ADDR:MASTER_PORT (torchrun's agent hosts it;
under Slurm rank 0 does), every key under ``shardbench/<attempt>/``. Each process writes its
host name there when it joins, then beats: a counter it adds to every ``BEAT_S`` from a thread
of its own, on a connection of its own. A peer whose counter has not moved for ``SILENT_S`` is
gone, so no process waits on a dead peer for longer than that, whatever it waits for; every
other wait has a deadline of its own.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from shardbench.core_binding import cores_of, own_cpus
from shardbench.harness.job import Job
from shardbench.harness.launch import POLL_S
from shardbench.wording import count

#: how long the processes of a job may take to start and meet (imports on a busy node, srun
#: starting tasks node by node)
JOIN_TIMEOUT_S = 300.0
BEAT_S = 1.0
#: a peer whose heartbeat stood still this long is gone
SILENT_S = 30.0


class JobError(RuntimeError):
    """The job cannot go on: its processes did not meet, or one of them is gone (one line)."""


class JobLink:
    """The job's store, its processes' hosts, and their heartbeats, seen from one process."""

    def __init__(self, job: Job, *, join_timeout_s: float = JOIN_TIMEOUT_S) -> None:
        self.job = job
        self.prefix = f"shardbench/{job.attempt}/"
        self._server: Any = None
        try:
            self.store = self._connect(join_timeout_s, serve=job.rank == 0 and not job.agent_store)
            self._beats = self._connect(join_timeout_s, serve=False)
        except RuntimeError as e:
            raise JobError(
                f"{job.describe()}: could not reach the job's store at {job.master_addr}:{job.master_port} "
                f"within {join_timeout_s:g}s ({_first_line(e)})"
            ) from None
        self.set(f"cpus/{job.rank}", ",".join(map(str, sorted(own_cpus()))))
        self.set(f"host/{job.rank}", socket.gethostname())
        self._stop = threading.Event()
        self._beater = threading.Thread(target=self._beat, name="shardbench-job-beat", daemon=True)
        self._beater.start()
        self._seen: dict[int, tuple[int, float]] = {}
        self.hosts = self._hosts(join_timeout_s)
        # each process's CPUs: srun may bind each task to cores of its own (--cpu-bind), so the
        # processes of one node do not always share its cores
        self.cpus = [_cpu_set(self.store.get(f"cpus/{r}").decode()) for r in range(job.world_size)]

    def _connect(self, timeout_s: float, *, serve: bool) -> Any:
        store = dist.TCPStore(
            self.job.master_addr,
            self.job.master_port,
            is_master=serve,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
        if serve:
            self._server = store  # kept: the store lives as long as this object
        return dist.PrefixStore(self.prefix, store)

    def _hosts(self, timeout_s: float) -> list[str]:
        keys = [f"host/{r}" for r in range(self.job.world_size)]
        deadline = time.monotonic() + timeout_s
        while not self.store.check(keys):
            if time.monotonic() > deadline:
                joined = sum(self.store.check([k]) for k in keys)
                raise JobError(
                    f"{self.job.describe()}: only {joined} of its "
                    f"{count(self.job.world_size, 'process', 'processes')} "
                    f"joined within {timeout_s:g}s (is every process running this same command, "
                    "started by torchrun or srun?)"
                )
            time.sleep(POLL_S)
        return [self.store.get(k).decode() for k in keys]

    def _beat(self) -> None:
        key = f"beat/{self.job.rank}"
        while not self._stop.is_set():
            try:
                self._beats.add(key, 1)
            except RuntimeError:  # the store is gone (its host ended): nothing left to tell
                return
            self._stop.wait(BEAT_S)

    def silent_for(self, rank: int) -> float:
        """Seconds since ``rank``'s heartbeat last moved (0 the first time it is asked); a store
        that cannot be reached counts as silence forever."""
        now = time.monotonic()
        try:
            count = self.store.add(f"beat/{rank}", 0)
        except RuntimeError:
            return float("inf")
        last = self._seen.get(rank)
        if last is None or last[0] != count:
            self._seen[rank] = (count, now)
            return 0.0
        return now - last[1]

    def set(self, key: str, value: str) -> None:
        with self._reachable():
            self.store.set(key, value)

    def has(self, key: str) -> bool:
        with self._reachable():
            return self.store.check([key])

    def get_json(self, key: str) -> Any:
        """The value at ``key``, which must be there already (``has``)."""
        with self._reachable():
            return json.loads(self.store.get(key).decode())

    @contextlib.contextmanager
    def _reachable(self) -> Iterator[None]:
        """A store that stopped answering means its host is gone: a ``JobError``, one line."""
        try:
            yield
        except RuntimeError as e:
            where = "rank 0" if not self.job.agent_store else "torchrun's agent on the first node"
            raise JobError(
                f"{self.job.describe()}: the job's store at {self.job.master_addr}:{self.job.master_port} "
                f"stopped answering ({_first_line(e)}): {where} is gone"
            ) from None

    def host(self, rank: int) -> str:
        return self.hosts[rank]

    def sharing_cores(self, rank: int, ranks: range) -> int:
        """How many of ``ranks`` (``rank`` included) run on ``rank``'s cores: on its node, with
        CPUs that overlap its own (a process whose CPUs are unknown overlaps every other)."""
        mine = self.cpus[rank]
        return sum(
            self.host(r) == self.host(rank) and (not mine or not self.cpus[r] or bool(mine & self.cpus[r]))
            for r in ranks
        )

    def own_cores(self, rank: int, ranks: range) -> tuple[int, ...] | None:
        """The cores ``rank`` binds to (``core_binding``): its block of the CPU set it shares with
        the other ``ranks`` on its node that have the very same set, in rank order. Where srun
        bound each task to cores of its own, a rank shares with none and keeps its own. None
        (left as it is) where binding is off, or where a rank of its node has CPUs unknown or
        overlapping its own without being the same set: no split of its set alone would keep
        the two apart."""
        mine = self.cpus[rank]
        neighbours = [r for r in ranks if self.host(r) == self.host(rank)]
        if not mine or any(
            not self.cpus[r] or (self.cpus[r] & mine and self.cpus[r] != mine) for r in neighbours
        ):
            return None
        sharers = [r for r in neighbours if self.cpus[r] == mine]
        return cores_of(sharers.index(rank), len(sharers), mine)

    def close(self) -> None:
        self._stop.set()
        self._beater.join(timeout=2 * BEAT_S)

    def __enter__(self) -> JobLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _cpu_set(text: str) -> frozenset[int]:
    return frozenset(int(c) for c in text.split(",") if c)
