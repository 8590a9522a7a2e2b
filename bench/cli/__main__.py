"""``python -m shardbench.cli``: the CLI without installing (the GPU image runs it this way)."""

import sys

from shardbench.cli import entry

if __name__ == "__main__":  # not when a forkserver child re-imports the parent's main module
    sys.exit(entry())
