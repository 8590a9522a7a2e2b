"""Run one measurement as several copies at once, each in a process of its own, as a cell's ranks
are. Copies that are threads of one process (``at_once``) share its interpreter lock: where the
work is Python between small kernels (AdamW's loop over a small model's tensors), two threads
take turns where two ranks would not. On the 2-core machine two threads replaying swav tiny's
update took 19.6 ms a step, two processes 4.1 ms, and its ranks' optimizer phase 4.6-5.4 ms.

A copy is ``python -m MODULE REQUEST``: its request a JSON object in the file REQUEST, with
``copy``, ``copies``, ``meet`` (a folder the copies share) and ``cores`` (those its rank would be
bound to, or None) added; it answers one JSON object, its standard output's last line
(``answer``). ``Together`` is the copy's side: it binds the copy to its cores, and each call
waits until every copy has reached the same call, so the copies' timed parts start at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: how long a copy waits for the others at a meeting before it gives up
MEET_TIMEOUT_S = 120.0


def run_at_once(module: str, request: dict[str, Any], copies: int, timeout_s: float) -> list[dict[str, Any]]:
    """``copies`` processes of ``python -m module`` on ``request``, at once; their answers, in
    order. A copy that fails, or a run that outlasts ``timeout_s``, ends them all and raises
    with the first failure's last line of output."""
    from shardbench.core_binding import cores_of, own_cpus

    cpus = own_cpus()
    with tempfile.TemporaryDirectory(prefix="shardbench-copies-") as meet:
        started = []
        try:
            for index in range(copies):
                cores = cores_of(index, copies, cpus)
                placed = {"copy": index, "copies": copies, "meet": meet, "cores": cores and list(cores)}
                body = {**request, **placed}
                asked = Path(meet) / f"request-{index}.json"
                asked.write_text(json.dumps(body))
                started.append(
                    subprocess.Popen(
                        [sys.executable, "-m", module, str(asked)],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                )
            _wait(started, module, timeout_s)
        finally:
            for p in started:
                if p.poll() is None:
                    p.kill()
            outputs = [p.communicate() for p in started]
    # a copy that failed on its own speaks first, before those ended for it
    ended = zip(started, outputs, strict=True)
    failed = sorted((p.returncode < 0, err) for p, (_, err) in ended if p.returncode)
    if failed:
        last = (failed[0][1].strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{module} failed: {last}")
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]


def _wait(started: list[subprocess.Popen], module: str, timeout_s: float) -> None:
    """Until every copy has ended, or one has failed (the others would wait for it at their
    next meeting): an answer is one short line, so no pipe fills while they run."""
    deadline = time.monotonic() + timeout_s
    while any(p.poll() is None for p in started):
        if any(p.returncode not in (None, 0) for p in started):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{module}: its {len(started)} copies outlasted {timeout_s:g} s")
        time.sleep(0.01)


class Together:
    """A copy's side of ``run_at_once``: bound to its rank's cores as it is made; each call
    returns once every copy has made as many calls."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.meet = Path(request["meet"])
        self.copy, self.copies = int(request["copy"]), int(request["copies"])
        self.calls = 0
        cores = request.get("cores")
        if cores and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cores)

    def __call__(self) -> None:
        self.calls += 1
        (self.meet / f"{self.calls}-{self.copy}").touch()
        waiting = [self.meet / f"{self.calls}-{other}" for other in range(self.copies)]
        deadline = time.monotonic() + MEET_TIMEOUT_S
        while not all(p.exists() for p in waiting):
            if time.monotonic() > deadline:
                raise TimeoutError(f"copy {self.copy}: the other copies never reached meeting {self.calls}")
            time.sleep(0.0005)


def read_request() -> dict[str, Any]:
    """A copy's request, from the file its command line names."""
    return json.loads(Path(sys.argv[1]).read_text())


def answer(result: dict[str, Any]) -> None:
    """A copy's answer, on its standard output's last line."""
    print(json.dumps(result), flush=True)
