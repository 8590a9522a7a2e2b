"""Run one measurement as several copies at once, each in a process of its own, as a cell's ranks
are. Copies that are threads of one process (``at_once``) share its interpreter lock: where the
work is Python between small kernels (AdamW's loop over many small tensors), two threads take
turns where two ranks would not. On the 2-core machine two threads replaying swav tiny's update
took 19.6 ms a step, two processes 4.1 ms, and its ranks' optimizer phase 4.6-5.4 ms.

A copy is ``python -m MODULE REQUEST``: its request a JSON object in the file REQUEST, with
``copy``, ``copies``, ``meet`` (a folder the copies share) and ``cores`` (those its rank would be
bound to, or None) added; it answers one JSON object, its standard output's last line
(``answer``); its output goes to files in that folder, so none waits on a full pipe.
``Together`` is the copy's side: it binds the copy to its cores, and each call waits until every
copy has reached the same call, so the copies' timed parts start at once.
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
    order. The first copy to fail ends the others (they would wait for it at their next
    meeting), as does a run that outlasts ``timeout_s``; either raises a RuntimeError with the
    failed copy's last line of output."""
    from shardbench.core_binding import cores_of, own_cpus

    cpus = own_cpus()
    with tempfile.TemporaryDirectory(prefix="shardbench-copies-") as meet:
        folder, started = Path(meet), []
        try:
            for index in range(copies):
                cores = cores_of(index, copies, cpus)
                placed = {"copy": index, "copies": copies, "meet": meet, "cores": cores and list(cores)}
                asked = folder / f"request-{index}.json"
                asked.write_text(json.dumps({**request, **placed}))
                command = [sys.executable, "-m", module, str(asked)]
                out, err = folder / f"out-{index}", folder / f"err-{index}"
                with out.open("w") as stdout, err.open("w") as stderr:
                    process = subprocess.Popen(
                        command, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr
                    )
                started.append(process)
            failed = _first_failure(started, timeout_s)
        finally:
            for p in started:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if failed is not None:
            last = _last_line(folder / f"err-{failed}") or "no output"
            raise RuntimeError(f"{module} failed: {last}")
        answers = [_last_line(folder / f"out-{index}") for index in range(copies)]
    if not all(answers):
        raise RuntimeError(f"{module}: a copy ended without an answer")
    return [json.loads(a) for a in answers]


def _first_failure(started: list[subprocess.Popen], timeout_s: float) -> int | None:
    """Wait until every copy has ended; the index of the first that failed (checked among all
    of them at every poll), or None."""
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [p.poll() for p in started]
        failed = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
        if failed is not None or all(code == 0 for code in codes):
            return failed
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(started)} copies outlasted {timeout_s:g} s")
        time.sleep(0.01)


def _last_line(path: Path) -> str:
    lines = path.read_text(errors="replace").strip().splitlines()
    return lines[-1] if lines else ""


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
