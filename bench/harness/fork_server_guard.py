"""The fork server's first import: it ends with its launcher and ignores a terminal's Ctrl-C.

multiprocessing's fork server can only be told modules to import (``launch.PRELOAD``), so this
one module exists to make that import the call; ``guardian.guard_launcher_child`` says why.
"""

from __future__ import annotations

from shardbench.harness.guardian import guard_launcher_child

guard_launcher_child()
