#!/usr/bin/env bash
# The prepared GPU check (DESIGN.md section 5): runs from the checkout without installing, using
# only what the GPU image has preinstalled (torch, transformers, pandas, matplotlib), writes
# records and tables under results/gpu/<date>/ and prints the table last.
# Usage: bash scripts/gpu-check.sh [extra `shardbench run` flags]
set -euo pipefail
cd "$(dirname "$0")/.."
out="results/gpu/$(date +%Y%m%d-%H%M%S)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
PYTHONPATH=. python3 -m bench.cli env
PYTHONPATH=. python3 -m bench.cli run --suite gpu-check --out "$out" "$@"
echo "records: $out/records.jsonl"
