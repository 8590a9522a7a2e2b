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

import importlib
import os
import sys

from shardbench.harness.guardian import FORK_SERVER_IMPORTS, guard_launcher_child


def import_each(modules: list[str]) -> None:
    """Import each of ``modules``. One that raises is named on stderr (the launcher's, whose
    terminal or log the server shares) and skipped. Python drops the failed module itself, so a
    rank that imports it runs it again and fails as it would without the server; what it
    imported before it raised stays imported, as in any process whose import failed (dropping
    that too would make a second copy of modules that others already hold)."""
    for module in modules:
        try:
            importlib.import_module(module)
        except (Exception, SystemExit) as error:  # noqa: BLE001 - any failure: the rank's to report
            print(f"fork server: left {module} to the ranks that need it: {error!r}", file=sys.stderr)


guard_launcher_child()
# read once: the ranks this server forks get their environment from the launcher, without it
import_each([m for m in os.environ.pop(FORK_SERVER_IMPORTS, "").split(",") if m])
