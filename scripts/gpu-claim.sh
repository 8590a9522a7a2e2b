#!/usr/bin/env bash
# The claim on one GPU: simulated N=8 memory on the card, max-size on an emulated 16 GiB card.
# Runs from the checkout without installing; writes results/claim/cuda/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/checkout-env.sh
python3 -m shardbench.cli claim --device cuda "$@"
