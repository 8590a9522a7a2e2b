#!/usr/bin/env bash
# Wheels of the 'peers' extra for the GPU image, built here (a machine with a package registry)
# into wheels/ (git-ignored), which the device run carries with the working tree; there
# scripts/checkout-env.sh installs them with no index and no dependency resolution.
#
# The image has torch, numpy, packaging, psutil and tqdm; DeepSpeed's other dependencies are
# fetched as wheels for the image's Python (3.12, manylinux x86_64). DeepSpeed and FairScale ship
# only sdists: they are built here without build isolation (isolation would fetch a second
# torch) and without their CUDA ops, which DeepSpeed JIT-builds at first use where nvcc exists;
# shardbench's DeepSpeed cells step the workload's own torch.optim.AdamW, so they need none.
# Usage: bash scripts/gpu-wheels.sh [PYTHON_VERSION]   (default 3.12)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-3.12}
out=wheels
mkdir -p "$out"
pip() { .venv/bin/python -m pip --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
pip wheel --quiet --no-deps --no-build-isolation -w "$out" deepspeed==0.19.8 fairscale==0.4.13
pip download --quiet --only-binary=:all: --python-version "$py" --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --implementation cp -d "$out" \
    einops hjson msgpack ninja py-cpuinfo nvidia-ml-py "pydantic>=2,<3"
ls -la "$out"
du -sh "$out"
