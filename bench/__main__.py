"""``python -m shardbench``: the command line, as torchrun and srun start it
(``torchrun ... -m shardbench run --suite nightly-gpu``)."""

import sys

from shardbench.cli import entry

if __name__ == "__main__":  # not when a forkserver child re-imports the parent's main module
    sys.exit(entry())
