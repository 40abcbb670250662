#!/usr/bin/env bash
# One device call: build, then retune the shipped GEMM policy maps of this GPU for the synthetic
# models (qspec tune: the isolated sweep, then the refinement inside whole decode steps and
# prefills), each map written where generate / serve find it (bench/policies/GPU-MODEL.json) and
# copied with its tuning record to $OUT (one log for all: $OUT brings back at most 8 files). Run it
# when the kernels a map can name change (a new strategy, a new default): a map measured before
# them overrides the built-in choice.
# usage (source root): QSPEC_COMMIT=... scripts/gpu-retune-maps.sh DEPS_PREFIX [MODEL ...]
#   default models: llama3-8b qwen2.5-7b llama2-7b (about a minute of tuning each on the H200)
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
deps=${1:-../deps}
shift || true
models=("$@")
(( ${#models[@]} )) || models=(llama3-8b qwen2.5-7b llama2-7b)
GPU_RUN_STEPS=build bash scripts/gpu-run.sh "$deps" || exit 1
rm -f "$out/build.log"
records="$out/records"
mkdir -p "$records"
for model in "${models[@]}"; do
  start=$(date +%s)
  echo "== $model" >> "$out/tune.log"
  ./build/qspec tune --synthetic "$model" --activations f16,int8 --record-dir "$records" > "$out/tune-$model.tmp" 2>&1
  rc=$?
  cat "$out/tune-$model.tmp" >> "$out/tune.log"
  echo "== $model: tune rc=$rc in $(( $(date +%s) - start )) s"
  grep -E "^wrote|refine|picked|s total" "$out/tune-$model.tmp" | tail -8
  rm -f "$out/tune-$model.tmp"
done
# The maps this call wrote (bench/policies on the device machine), beside the records.
for map in bench/policies/*.json; do
  [[ $map -nt "$out/env.txt" ]] && cp "$map" "$out/"
done
ls -la "$out" "$records"
