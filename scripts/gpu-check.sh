#!/usr/bin/env bash
# The prepared GPU check: runs from the checkout without installing (scripts/checkout-env.sh),
# using only what the GPU image has preinstalled plus the wheels in wheels/ when they were
# carried (scripts/gpu-wheels.sh builds them), writes records, tables and charts under
# results/gpu/<date>/ and prints the tables last. Steps, by value:
#   plan      planning accuracy and the allocator's overhead: transformer 1b at a simulated N=8,
#             every strategy that can simulate, real tensors vs --fake (the data behind plan's
#             CUDA reserve: max_reserved / max_allocated per strategy, and the CUDA context);
#   fp16      the plan at fp16 with the loss scaler: transformer 1b at a simulated N=8 under ddp,
#             zero2 and zero3, real tensors vs --fake;
#   own       your own model's plan against the card: a Llama shape (hf:) at sequence 2048,
#             bf16, simulated N=8, ddp, zero2 and zero3, real tensors vs --fake;
#   peers     DeepSpeed ZeRO-2 and FairScale OSS + ShardedDataParallel train on CUDA (one rank:
#             one card cannot host a multi-rank NCCL world), from the carried wheels;
#   suite     the gpu-check suite (each workload's paper preset under ddp, transformer base dp/ddp);
#   torchrun  the same suite as a one-process torchrun job (torchrun --nproc-per-node 1 -m
#             shardbench), then `compare` of the two runs (after `suite`; its exit code is logged);
#   max-size  max-size on an emulated 16 GiB card (allocator fraction), simulated N=8.
# Each step has a wall-clock cap (GNU timeout signals the step's whole process group, so no rank
# outlives it) and writes its records before the next starts. Before the steps, the CUDA context
# (scripts/measure_cuda_context.py): with the allocator figures of every step's records, what
# `plan`'s reserve is derived from (scripts/derive_cuda_reserve.py). With $OUT set (the device tool),
# everything is also packed into $OUT/gpu-check.tgz. The claim has its own script
# (scripts/gpu-claim.sh): it takes longer.
# Usage: bash scripts/gpu-check.sh [STEP ...]   (default: plan own peers, about 8 minutes)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
source scripts/checkout-env.sh
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(plan own peers)
out="results/gpu/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
SB=(python3 -m shardbench.cli)
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
"${SB[@]}" env | tee "$out/env.json"
python3 scripts/measure_cuda_context.py > "$out/cuda-context.json" || rm -f "$out/cuda-context.json"
"${SB[@]}" list | tee "$out/list.txt"  # which peers the carried wheels made available
for s in "${steps[@]}"; do
    case $s in
    plan)
        plan=(--workload transformer --preset 1b --world-size 8 --batch-size 8 --device cuda --steps 5
              --warmup 2 --timeout 90
              --strategy ddp,zero1,zero2,zero3,torch-zero1,fsdp2-zero2,fsdp2-zero3)
        step plan-real 240 "${SB[@]}" run "${plan[@]}" --simulate --out "$out/plan-real"
        step plan-fake 120 "${SB[@]}" run "${plan[@]}" --fake --out "$out/plan-fake"
        "${SB[@]}" report "$out/plan-real" "$out/plan-fake" --out "$out/plan-report" >/dev/null 2>&1 ;;
    fp16)
        half=(--workload transformer --preset 1b --world-size 8 --batch-size 8 --device cuda --steps 5
              --warmup 2 --timeout 90 --precision fp16 --strategy ddp,zero2,zero3)
        step fp16-real 180 "${SB[@]}" run "${half[@]}" --simulate --out "$out/fp16-real"
        step fp16-fake 90 "${SB[@]}" run "${half[@]}" --fake --out "$out/fp16-fake"
        "${SB[@]}" report "$out/fp16-real" "$out/fp16-fake" --out "$out/fp16-report" >/dev/null 2>&1 ;;
    own)
        llama=(--workload hf:LlamaForCausalLM --model-config
               hidden_size=2048,intermediate_size=5632,num_hidden_layers=22,num_attention_heads=32,num_key_value_heads=4
               --seq-len 2048 --strategy ddp,zero2,zero3 --world-size 8 --precision bf16 --batch-size 2
               --device cuda --steps 3 --warmup 1 --timeout 90)
        step own-real 120 "${SB[@]}" run "${llama[@]}" --simulate --out "$out/own-real"
        step own-fake 90 "${SB[@]}" run "${llama[@]}" --fake --out "$out/own-fake"
        "${SB[@]}" report "$out/own-real" "$out/own-fake" --out "$out/own-report" >/dev/null 2>&1 ;;
    peers)
        step peers 120 "${SB[@]}" run --workload transformer --preset base --world-size 1 --device cuda \
            --strategy ddp,deepspeed-zero2,fairscale-zero2 --batch-size 8 --steps 5 --warmup 2 --timeout 60 \
            --out "$out/peers" ;;
    suite)
        step suite 170 "${SB[@]}" run --suite gpu-check --out "$out/suite" ;;
    torchrun)
        step torchrun-suite 200 python3 -m torch.distributed.run --nproc-per-node 1 --standalone -m shardbench run --suite gpu-check \
            --out "$out/torchrun-suite"
        [ -d "$out/suite" ] && step torchrun-compare 60 "${SB[@]}" compare "$out/suite" "$out/torchrun-suite" \
            --out "$out/torchrun-compare" ;;
    max-size)
        step max-size 170 "${SB[@]}" max-size --workload transformer --strategy ddp,zero2 --world-size 8 \
            --simulate --device cuda --budget 16GiB --batch-size 8 --timeout 60 \
            --ladder base,large,h1024-l40,h1536-l32,1b,h2048-l32,2.5b,h3072-l32,6b --out "$out/max-size-16gib" ;;
    *) echo "gpu-check: unknown step $s (steps: plan fp16 own peers suite torchrun max-size)" >&2; exit 2 ;;
    esac
    pack
done
echo "== steps"; cat "$out/steps.txt"
for t in plan-real plan-fake fp16-real fp16-fake own-real own-fake peers suite torchrun-suite max-size-16gib; do
    [ -f "$out/$t/table.md" ] && { echo "== $t"; cat "$out/$t/table.md"; }
done
echo "results: $out"
