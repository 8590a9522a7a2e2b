#!/usr/bin/env bash
# The prepared GPU check (DESIGN.md section 5): runs from the checkout without installing, using
# only what the GPU image has preinstalled (torch, transformers, pandas, matplotlib), writes
# records, tables and charts under results/gpu/<date>/ and prints the tables last.
#   1. the gpu-check suite (each workload's paper preset under ddp, transformer base dp/ddp);
#   2. planning accuracy: transformer 1b at a simulated N=8, real tensors vs --fake, per strategy;
#   3. your own model's plan against the card (#14): the TinyLlama-1.1B shape (hf:), bf16,
#      simulated N=8, ddp and zero2, real tensors vs --fake (the planning error in %);
#   4. max-size on an emulated 16 GiB card (allocator fraction), simulated N=8, ddp vs zero2.
# Each step has a wall-clock cap (GNU timeout signals the step's whole process group, so no rank
# outlives it) and the steps are ordered by value, so a short lease still brings back step 1.
# Before step 1, the CUDA context (scripts/measure_cuda_context.py): with the allocator figures of
# every step's records, what `plan`'s reserve is derived from (scripts/derive_cuda_reserve.py).
# With $OUT set (the device tool), everything is also packed into $OUT/gpu-check.tgz.
# The claim has its own script (scripts/gpu-claim.sh): it takes longer.
# Usage: bash scripts/gpu-check.sh [extra `shardbench run` flags for step 1]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
out="results/gpu/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
source scripts/checkout-env.sh
sb() { python3 -m shardbench.cli "$@"; }
SB=(python3 -m shardbench.cli)  # for `timeout`, which cannot run a shell function
step() {  # step NAME SECONDS CMD...: run with a cap, log its output and wall time
    local name=$1 cap=$2 t0 rc
    shift 2
    t0=$(date +%s)
    timeout --kill-after=15 "$cap" "$@" 2>&1 | tee "$out/$name.log"
    rc=${PIPESTATUS[0]}
    echo "$name: rc=$rc wall=$(($(date +%s) - t0))s (cap ${cap}s)" | tee -a "$out/steps.txt"
}
pack() { [ -n "${OUT:-}" ] && tar czf "$OUT/gpu-check.tgz" "$out" 2>/dev/null; }
trap pack EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,temperature.gpu --format=csv \
    | tee "$out/nvidia-smi.csv" || true
sb env | tee "$out/env.json"
python3 scripts/measure_cuda_context.py > "$out/cuda-context.json" || rm -f "$out/cuda-context.json"
step suite 170 "${SB[@]}" run --suite gpu-check --out "$out/suite" "$@"
pack
plan=(--workload transformer --preset 1b --strategy ddp,zero2,fsdp2-zero2 --world-size 8
      --batch-size 8 --device cuda --steps 5 --warmup 2 --timeout 90)
step plan-real 100 "${SB[@]}" run "${plan[@]}" --simulate --out "$out/plan-real"
step plan-fake 100 "${SB[@]}" run "${plan[@]}" --fake --out "$out/plan-fake"
pack
llama=(--workload hf:LlamaForCausalLM --model-config
       hidden_size=2048,intermediate_size=5632,num_hidden_layers=22,num_attention_heads=32,num_key_value_heads=4
       --strategy ddp,zero2 --world-size 8 --precision bf16 --batch-size 8 --device cuda --steps 3 --warmup 1
       --timeout 90)
step own-real 100 "${SB[@]}" run "${llama[@]}" --simulate --out "$out/own-real"
step own-fake 100 "${SB[@]}" run "${llama[@]}" --fake --out "$out/own-fake"
pack
step max-size 170 "${SB[@]}" max-size --workload transformer --strategy ddp,zero2 --world-size 8 --simulate \
    --device cuda --budget 16GiB --batch-size 8 --timeout 60 \
    --ladder base,large,h1024-l40,h1536-l32,1b,h2048-l32,2.5b,h3072-l32,6b --out "$out/max-size-16gib"
sb report "$out/plan-real" "$out/plan-fake" --out "$out/plan-report" >/dev/null 2>&1 || true
sb report "$out/own-real" "$out/own-fake" --out "$out/own-report" >/dev/null 2>&1 || true
echo "== steps"; cat "$out/steps.txt"
for t in suite plan-real plan-fake own-real own-fake max-size-16gib; do
    [ -f "$out/$t/table.md" ] && { echo "== $t"; cat "$out/$t/table.md"; }
done
echo "results: $out"
