"""Nothing of a run outlives its launcher, however the launcher dies (SIGKILL included).

Every file a launcher keeps while cells run (each cell's directory, multiprocessing's fork-server
socket) lives in one private directory per launcher process, made short on purpose: a Unix
socket path must fit 108 bytes, whatever ``TMPDIR`` is (``private_dir``).

The fork server, which forks the CPU ranks, can only be given modules to import: it imports
``fork_server_guard`` (``launch.forkserver_context``), which calls ``guard_launcher_child``
before it imports anything else. That starts a
thread that waits on the launcher's pid (a pidfd: it becomes readable when the process
is gone, with no pid-reuse race); when the launcher dies, the server removes the private
directory and exits, and the ranks it forked, whose parent-death signal is tied to it, are killed
by the kernel. Exec'd (CUDA) ranks are the launcher's own children: their parent-death signal is
tied to the launcher, and the worker calls ``guard_launcher_child`` as it starts, so they wait on
it the same way. Importing this module does nothing.

A launcher that exits normally removes its private directory at exit; a directory whose
launcher died without its guardian (an older version, a kernel without pidfds) is removed by
the next launcher that starts (``private_dir``).
"""

from __future__ import annotations

import contextlib
import multiprocessing.util
import os
import re
import select
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

#: set by the launcher for the processes it starts: whom to watch, and what to remove
LAUNCHER_PID = "SHARDBENCH_LAUNCHER_PID"
PRIVATE_DIR = "SHARDBENCH_PRIVATE_DIR"
#: set by the launcher for its fork server: what the server imports after its guard,
#: comma-separated (``fork_server_guard``)
FORK_SERVER_IMPORTS = "SHARDBENCH_FORK_SERVER_IMPORTS"
#: a Unix socket path holds at most 107 bytes; multiprocessing adds ~25 for its listener
MAX_BASE = 60
_NAME = re.compile(r"^sb-(\d+)-")
_made: Path | None = None


class NoPrivateDir(OSError):
    """No short writable directory for the launcher's files (the message says why)."""


def private_dir() -> Path:
    """This launcher's private directory (made at first use, short, removed at exit), with its
    pid in the name so a later launcher can tell a dead one's leftovers. Raises ``OSError`` with
    one line when no short writable directory exists."""
    global _made
    if _made is not None and _made.is_dir():
        return _made
    bases = [tempfile.gettempdir(), "/tmp", "/dev/shm", "/var/tmp"]
    for base in dict.fromkeys(bases):
        if len(base) > MAX_BASE or not os.access(base, os.W_OK):
            continue
        _remove_stale(Path(base))
        try:
            made = Path(tempfile.mkdtemp(prefix=f"sb-{os.getpid()}-", dir=base))
        except OSError:
            continue
        _made = made
        # removed at exit after multiprocessing's own finalizers (exit priority 0 and up), which
        # unlink the sockets they made here: removed first, each unlink would print a traceback
        multiprocessing.util.Finalize(None, shutil.rmtree, args=(made, True), exitpriority=-100)
        os.environ[LAUNCHER_PID] = str(os.getpid())
        os.environ[PRIVATE_DIR] = str(made)
        return made
    raise NoPrivateDir(
        f"no short writable directory for the launcher's sockets (TMPDIR {tempfile.gettempdir()!r} "
        f"is over {MAX_BASE} characters or not writable, and /tmp, /dev/shm and /var/tmp are not usable)"
    )


def _remove_stale(base: Path) -> None:
    """Remove private directories of launchers that are no longer running."""
    with contextlib.suppress(OSError):
        for entry in base.iterdir():
            m = _NAME.match(entry.name)
            if m and entry.is_dir() and not _alive(int(m.group(1))):
                shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_for_exit(pid: int) -> None:
    """Block until process ``pid`` has exited (a pidfd where the kernel has them, else polling)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):
        while _alive(pid):
            time.sleep(0.2)
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def guard(remove: Path | None, then: str) -> None:
    """Start a daemon thread that, once the launcher named in the environment is gone, removes
    ``remove`` and then ends this process (``then="exit"``) or its whole process group
    (``then="group"``: a rank and anything it spawned). Does nothing outside a launcher's run
    (under torchrun, in tests)."""
    launcher = os.environ.get(LAUNCHER_PID)
    if not launcher or int(launcher) == os.getpid():
        return

    def watch() -> None:
        wait_for_exit(int(launcher))
        if remove is not None:
            shutil.rmtree(remove, ignore_errors=True)
        if then == "group":
            os.killpg(0, signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name="shardbench-guardian", daemon=True).start()


def guard_launcher_child() -> None:
    """In a process the launcher started itself (its fork server, an exec'd rank): guard the
    private directory, and ignore SIGINT. A terminal's Ctrl-C reaches the launcher's whole
    process group, this process included; the fork server is protected from it by
    multiprocessing only once its preload imports are done, so a Ctrl-C during them would print
    a KeyboardInterrupt traceback over the launcher's own "interrupted" line. The launcher
    handles the interrupt and stops its children itself. Does nothing in any other process."""
    launcher = os.environ.get(LAUNCHER_PID)
    if launcher and int(launcher) == os.getppid():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        private = os.environ.get(PRIVATE_DIR)
        guard(Path(private) if private else None, then="exit")
