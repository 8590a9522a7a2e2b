#!/usr/bin/env bash
# The prepared GPU check (DESIGN.md section 5): runs from the checkout without installing, using
# only what the GPU image has preinstalled (torch, transformers, pandas, matplotlib), writes
# records, tables and charts under results/gpu/<date>/ and prints the tables last.
#   1. the gpu-check suite (each workload's paper preset under ddp, transformer base dp/ddp);
#   2. planning accuracy: transformer 1b at a simulated N=8, real tensors vs --fake, per strategy;
#   3. max-size on an emulated 16 GiB card (allocator fraction), simulated N=8, ddp vs zero2.
# The claim has its own script (scripts/gpu-claim.sh): it takes longer.
# Usage: bash scripts/gpu-check.sh [extra `shardbench run` flags for step 1]
set -euo pipefail
cd "$(dirname "$0")/.."
out="results/gpu/$(date +%Y%m%d-%H%M%S)"
sb() { PYTHONPATH=. python3 -m bench.cli "$@"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
sb env
sb run --suite gpu-check --out "$out/suite" "$@" || true
plan=(--workload transformer --preset 1b --strategy ddp,zero2,fsdp2-zero2 --world-size 8 --batch-size 8 --device cuda)
sb run "${plan[@]}" --simulate --out "$out/plan-real" || true
sb run "${plan[@]}" --fake --out "$out/plan-fake" || true
sb max-size --workload transformer --strategy ddp,zero2 --world-size 8 --simulate --device cuda \
    --budget 16GiB --batch-size 8 --out "$out/max-size-16gib" || true
sb report "$out/plan-real" "$out/plan-fake" --out "$out/plan-report"
echo "results: $out"
