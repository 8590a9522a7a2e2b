#!/usr/bin/env bash
# Idempotent set-up: create .venv and install the project (with the dev, peers and lightning
# extras) only when pyproject.toml changed since the last successful install. Safe to run before
# every command.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.shardbench-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "setup: installing shardbench and its pinned stack into .venv (first time: a few minutes: it downloads the pinned stack and builds DeepSpeed)" >&2
    # This machine's pip config lists local mirrors that lack most packages; pip warns about each.
    pip() { .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@" \
        2> >(grep -v "is ignored: it is neither" >&2); }
    # uv resolves and installs the pinned stack in well under a minute where pip takes about
    # five. It reads no pip configuration and installs from the package registry; when it cannot
    # (no uv, no registry), pip does the same install with this machine's configuration.
    # DeepSpeed (the 'peers' extra) builds from its sdist (build isolation would fetch a second
    # torch), so the build tools come first and nothing is isolated.
    # --compile-bytecode: uv leaves the .pyc files out by default, and where PYTHONDONTWRITEBYTECODE
    # is set they are never written later, so every process (each test's, each launcher's fork
    # server) would compile torch and transformers from source again: seconds per process.
    uv() { .venv/bin/python -m uv pip install --quiet --compile-bytecode --python .venv/bin/python "$@"; }
    if ! { pip uv 2>/dev/null && uv setuptools wheel ninja &&
           uv --no-build-isolation -e '.[dev,peers,lightning]'; }; then
        echo "setup: uv could not install; installing with pip instead (several minutes)" >&2
        pip setuptools wheel ninja
        pip --no-build-isolation -e '.[dev,peers,lightning]'
    fi
    # DeepSpeed JIT-builds its CPU shared-memory comm op at first use (~30 s, then cached under
    # ~/.cache/torch_extensions): built here, so a first test or cell does not pay for it.
    .venv/bin/python -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()" >/dev/null 2>&1 ||
        echo "setup: DeepSpeed's CPU comm op did not build now; it will be built at first use" >&2
    echo "$want" > "$stamp"
fi
# The checkout's own sources, compiled beside them (git ignores __pycache__): stale files are
# recompiled, so this is quick when nothing changed.
.venv/bin/python -m compileall -q bench models tests >/dev/null || true
