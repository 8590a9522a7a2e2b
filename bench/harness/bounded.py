"""A workload of your own is first checked in a child process, under the cell's timeout.

Checking a cell means running the user's code in the launcher: importing the module, calling the
factory, ``ModelSpec.build`` on the meta device, an ``hf:`` config and its meta build. Any of
those can hang (a factory that waits on a network share), take minutes (a meta build of a
100,000-layer config) or end the process (``os._exit`` in a library). Run in the launcher, none
of that is bounded by ``--timeout``, and an exit ends the command with the user code's exit code.

So each (workload, preset) of one's own is first checked in a child forked from the launcher's
fork server (warm: torch and the strategies are already imported), which dies with the launcher
(``guardian``). The launcher waits at most the cell's timeout. A child still running is asked for
its stack (faulthandler), stopped, and the check fails with one line naming the step and the
frame it was stuck in; a child that exits without a verdict fails it naming the exit code. Only a
check that passed in the child is repeated in the launcher, where it now returns as it did there.
Built-in workloads are the project's own code and are not forked for.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from shardbench.harness import launch
from shardbench.harness.result import signal_name

#: the last line the child wrote naming what it was doing
STEP = "shardbench-check-step: "
#: (workload, preset, fake, checkpointing) checks that passed in a child, in this launcher
_passed: dict[tuple, str] = {}


def check_workload(
    name: str, preset: str | None, *, timeout_s: float, fake: bool = False, checkpointing: bool = False
) -> str | None:
    """Check a workload of one's own (``hf:``, ``module:factory``, ``file.py:factory``, an entry
    point) in a child under ``timeout_s``: it resolves, ``preset`` (default: its first) builds on
    the meta device and is counted, and the fake planner or activation checkpointing takes it
    when asked. Returns the preset checked (None for a built-in workload, never forked for);
    ``ValueError`` with one line when the check fails, hangs or the process ends under it."""
    from shardbench.models.specs import is_spec

    if not is_spec(name):
        return None
    key = (name, preset, fake, checkpointing)
    if key in _passed:
        return _passed[key]
    tmp = Path(tempfile.mkdtemp(prefix="check-", dir=launch.launcher_dir()))
    try:
        chosen = _check_in_child(name, preset, fake, checkpointing, timeout_s, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _passed[key] = _passed[(name, chosen, fake, checkpointing)] = chosen
    return chosen


def _check_in_child(
    name: str, preset: str | None, fake: bool, checkpointing: bool, timeout_s: float, tmp: Path
) -> str:
    log, verdict = tmp / "check.log", tmp / "verdict.json"
    env = dict(os.environ, SHARDBENCH_CALLER_CWD=os.getcwd())
    proc = launch.forkserver_context().Process(
        target=_child_main,
        args=(name, preset, fake, checkpointing, env, str(log), str(verdict)),
        name="workload-check",
    )
    what = f"workload {name!r}" + (f" with preset {preset!r}" if preset else "")
    proc.start()
    try:
        deadline = time.monotonic() + timeout_s
        while proc.exitcode is None and time.monotonic() < deadline:
            time.sleep(launch.POLL_S)
        if proc.exitcode is None:  # still running: where is it?
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(launch.STACK_DUMP_WAIT_S)
            text = launch._tail(log, 20000)
            where = launch.stuck_at(text)
            raise ValueError(
                f"{what}: still {_last_step(text)} after {timeout_s:g} s (the cell's --timeout)"
                + (f", in {where}" if where else "")
                + "; nothing was run. Give a longer --timeout if it is only slow"
            )
    finally:
        _stop(proc)
    if verdict.exists():
        result = json.loads(verdict.read_text())
        if "error" in result:
            raise ValueError(result["error"])
        return result["preset"]
    sig = signal_name(proc.exitcode)
    how = f"was killed by {sig}" if sig else f"ended the process with exit code {proc.exitcode}"
    raise ValueError(
        f"{what}: the code {how} while {_last_step(launch._tail(log, 20000))}; "
        "your code must return (raise an exception to fail)"
    )


def _last_step(log_text: str) -> str:
    at = log_text.rfind(STEP)
    return log_text[at + len(STEP) :].splitlines()[0] if at >= 0 else "starting"


def _stop(proc) -> None:  # noqa: ANN001  (a multiprocessing process)
    """SIGKILL the child's process group (it and anything it spawned), reap it; bounded."""
    if proc.exitcode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.join(timeout=launch.TERMINATE_GRACE_S)


def _child_main(
    name: str, preset: str | None, fake: bool, checkpointing: bool, env: dict, log_path: str, verdict: str
) -> None:
    """In the forked child: the checks the launcher would run, each step announced in the log."""
    os.setpgid(0, 0)
    launch._die_with_parent()
    launch.output_to_log(log_path)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    os.environ.clear()
    os.environ.update(env)

    def step(doing: str) -> None:
        print(STEP + doing, flush=True)

    try:
        from shardbench.models.registry import get_workload

        step(
            f"loading workload {name!r} (importing its module and calling its factory, or the "
            "transformers class)"
        )
        workload = get_workload(name)
        step(f"reading the presets of {name!r}")
        chosen = preset or next(iter(workload.presets))
        step(f"checking {name!r} preset {chosen!r} (the factory, then a build on the meta device)")
        workload.check_preset(chosen)
        step(f"counting the parameters of {name!r} preset {chosen!r}")
        workload.param_count(chosen)
        if fake:
            step(f"checking that {name!r} can be planned (--fake)")
            workload.check_plannable()
        if checkpointing:
            step(f"finding the blocks of {name!r} to checkpoint")
            workload.check_checkpointable()
        result = {"preset": chosen}
    except ValueError as e:
        result = {"error": str(e)}
    except Exception as e:  # user code may raise anything; the launcher prints one line
        result = {"error": f"workload {name!r}: {type(e).__name__}: {e}"}
    partial = Path(verdict + ".partial")  # renamed whole: a child killed mid-write leaves no verdict
    partial.write_text(json.dumps(result))
    partial.rename(verdict)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # (no atexit handlers of the fork server's in this child)
