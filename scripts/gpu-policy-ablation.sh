#!/usr/bin/env bash
# One device call: build, then the Fig. 12 ablation of the shipped GEMM policy maps (ADAngel) for
# the synthetic models: each map against `builtin`, the paper's rule and every static strategy,
# decode steps at batch 1-64 and prefills of 16-2048 tokens, w4a16 and w4a8, one log for all and a
# JSON a run under $OUT (at most 8 files come back). Run it after scripts/gpu-retune-maps.sh.
# usage (source root): [ABLATION_MODES="w4a16 w4a8"] scripts/gpu-policy-ablation.sh DEPS_PREFIX [MODEL ...]
#   default models: llama3-8b qwen2.5-7b (~1 minute a model and mode on the H200)
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
deps=${1:-../deps}
shift || true
models=("$@")
(( ${#models[@]} )) || models=(llama3-8b qwen2.5-7b)
GPU_RUN_STEPS=build bash scripts/gpu-run.sh "$deps" || exit 1
rm -f "$out/build.log"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-')
f16_forced=forced:small_m_v5,forced:tiled_128x32,forced:tiled_256x64,forced:wgmma_128x128,forced:wgmma_128x256,forced:dequant_cublas
int8_forced=forced:small_m_v5,forced:tiled_128x32,forced:tiled_128x128,forced:tiled_256x64,forced:s8_wgmma_128x128
for model in "${models[@]}"; do
  map=bench/policies/$gpu-$model.json
  for mode in ${ABLATION_MODES:-w4a16 w4a8}; do
    forced=$f16_forced
    [[ $mode == w4a8 ]] && forced=$int8_forced
    ./build/qspec bench --device cuda --synthetic "$model" --modes $mode --batch-sizes 1,8,16,32,64 \
      --prompt-lengths 16,64,128,256,512,1024,2048 --steps 32 --ablation-repeats 3 \
      --gemm-ablation "$map,builtin,paper-rule,$forced" --out-dir "$out/$model-$mode" >> "$out/ablation.log" 2>&1
    echo "$model $mode rc=$?"
  done
done
grep -E "^(GPU|w4a|point|decode|TTFT)" "$out/ablation.log"
