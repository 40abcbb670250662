#!/usr/bin/env bash
# One device call: build, GEMM bench (small-M / tiled / dequant+cuBLAS / cuBLAS f16), pick the
# W4A16 crossovers from it (tools/pick_w4a16_crossover.py), rebuild with them, then the model
# benchmark (qspec bench --device cuda) on synthetic full-size shapes. Logs and JSON to $OUT.
# usage (source root): QSPEC_COMMIT=... scripts/gpu-bench-all.sh DEPS_PREFIX
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
deps=${1:-../deps}
GPU_RUN_STEPS="build bench" scripts/gpu-run.sh "$deps" --ms 1,8,16,32,64,128,256,512 --variants 1 --tiles 1,2,3 \
  > "$out/gemm-run.log" 2>&1
echo "gemm bench: $(grep -E 'build rc|bench rc' "$out/gemm-run.log" | tr '\n' ' ')"
python3 tools/pick_w4a16_crossover.py "$out/bench.json" | tee "$out/crossover.txt"
read -r small tiled < <(tail -1 "$out/crossover.txt")
if [[ -n ${small:-} && -n ${tiled:-} ]]; then
  cmake -S . -B build -DCMAKE_CUDA_FLAGS="-DQSPEC_W4A16_SMALL_M_MAX=$small -DQSPEC_W4A16_TILED_M_MAX=$tiled" >/dev/null &&
    ninja -C build -j"$(nproc)" qspec > "$out/rebuild.log" 2>&1
  echo "rebuilt with small-M <= $small, tiled <= $tiled: rc=$?"
fi
for model in ${GPU_BENCH_MODELS:-llama3-8b llama2-7b qwen2.5-7b}; do
  args=(--batch-sizes 1,8,16,32,64 --prompt-lengths 128,512,2048)
  [[ $model != llama3-8b ]] && args=(--batch-sizes 1,16,64 --prompt-lengths 128,1024 --steps 32)
  timeout "${GPU_BENCH_TIMEOUT:-170}" ./build/qspec bench --device cuda --synthetic "$model" "${args[@]}" --out-dir "$out" \
    > "$out/bench-$model.log" 2>&1
  echo "== $model rc=$?"
  grep -E "decode:|time to first|^ +[0-9]+ " "$out/bench-$model.log"
done
