"""The fork server's one preloaded module: it ends with its launcher, ignores a terminal's
Ctrl-C, then imports what its ranks would import, each on its own.

multiprocessing's fork server can only be told modules to import, and it stops at the first of
them that raises anything but an ImportError: every rank it would fork, and so every cell of the
run, would then fail to start. So the launcher names this one module
(``launch.forkserver_context``) and the rest in the server's environment
(``guardian.FORK_SERVER_IMPORTS``), and a module that raises here is left out: a rank that needs
it imports it itself and fails as that rank, in its own cell's record.
``guardian.guard_launcher_child`` says why the guard comes first.
"""

from __future__ import annotations

import contextlib
import importlib
import os

from shardbench.harness.guardian import FORK_SERVER_IMPORTS, guard_launcher_child


def import_each(modules: list[str]) -> None:
    """Import each of ``modules``; one that raises is skipped (see the module's docstring)."""
    for module in modules:
        with contextlib.suppress(Exception, SystemExit):
            importlib.import_module(module)


guard_launcher_child()
import_each([m for m in os.environ.get(FORK_SERVER_IMPORTS, "").split(",") if m])
