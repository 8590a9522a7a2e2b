"""``python -m bench.cli``: the CLI without installing (the GPU image runs it this way)."""

import sys

from bench.cli import main

sys.exit(main())
