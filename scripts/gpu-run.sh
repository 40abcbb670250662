#!/usr/bin/env bash
# One call on the GPU machine: configure + build the CUDA targets, run the `gpu` test label,
# run the GEMM benchmark. Logs and JSON go to $OUT (or ./gpu-out). Run from the source root.
#
# usage: scripts/gpu-run.sh [DEPS_PREFIX] [bench args...]
#   DEPS_PREFIX: made by scripts/bundle-deps.sh (default ../deps when it exists)
#   env: QSPEC_COMMIT (the commit these sources are, recorded in the bench JSON),
#        GPU_RUN_STEPS (default "build test bench"; "ncu" adds a profile), GPU_TEST_FILTER (gtest
#        filter), NCU_BENCH_ARGS (which bench configs the ncu step profiles)
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
deps=${1:-../deps}
shift || true
steps=${GPU_RUN_STEPS:-build test bench}
deps_arg=()
[[ -d $deps ]] && deps_arg=(-DQSPEC_DEPS_PREFIX="$(cd "$deps" && pwd)")
jobs=$(nproc)
{
  echo "commit ${QSPEC_COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  nvcc --version | tail -1
} 2>&1 | tee "$out/env.txt"

rc=0
if [[ $steps == *build* ]]; then
  start=$(date +%s)
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DQSPEC_CUDA=ON -DQSPEC_CUDA_ARCHS=90a -DQSPEC_SERVER=OFF \
    "${deps_arg[@]}" > "$out/build.log" 2>&1 &&
    ninja -C build -j"$jobs" qspec_gpu_tests qspec_gpu_bench qspec >> "$out/build.log" 2>&1
  rc=$?
  echo "build rc=$rc in $(( $(date +%s) - start )) s"
  if (( rc != 0 )); then grep -E "error|FAILED" -A3 "$out/build.log" | head -60; exit $rc; fi
fi
if [[ $steps == *test* ]]; then
  start=$(date +%s)
  ./build/tests/qspec_gpu_tests --gtest_filter="${GPU_TEST_FILTER:-*}" --gtest_output=json:"$out/gpu_tests.json" \
    > "$out/gpu_tests.log" 2>&1
  trc=$?
  echo "gpu tests rc=$trc in $(( $(date +%s) - start )) s"
  grep -E "^\[  (FAILED|PASSED) |worst rel err|Failure|Expected|Which is|error" "$out/gpu_tests.log" | head -80
  (cd build && ctest -L gpu -N | tail -1)
  rc=$(( rc || trc ))
fi
if [[ $steps == *bench* ]]; then
  ./build/tests/qspec_gpu_bench "$out/bench.json" "$@" > "$out/bench.log" 2>&1
  echo "bench rc=$?"
  cat "$out/bench.log"
fi
if [[ $steps == *ncu* ]]; then
  # Per-kernel hardware view of the W4A16 kernels: NCU_BENCH_ARGS picks them (bench --profile).
  ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__waves_per_multiprocessor,launch__occupancy_limit_shared_mem,launch__occupancy_limit_registers,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread \
    -k regex:w4a16 ./build/tests/qspec_gpu_bench "$out/profile.json" --profile --no-baselines ${NCU_BENCH_ARGS:-} \
    > "$out/ncu.log" 2>&1
  echo "ncu rc=$?"
  grep -E "profiled|w4a16_.*kernel|gpu__time|dram__|launch__|sm__warps" "$out/ncu.log" | sed -E 's/ +/ /g' | cut -c1-160 | head -150
fi
exit $rc
