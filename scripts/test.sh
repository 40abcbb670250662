#!/usr/bin/env bash
# Builds qspec and runs its tests in two builds: a release build (with CUDA where nvcc is found)
# that runs the end-to-end tests (and the GPU tests where a GPU is present), and one clang build
# with AddressSanitizer + UndefinedBehaviorSanitizer and libFuzzer's coverage that runs every unit
# test and each fuzz target for a bounded time. One sanitizer build for both: CI has 2 cores and
# 45 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
CUDA_ARCHS=${QSPEC_CUDA_ARCHS:-90a}   # CI compiles CUDA for sm_90a only
# A compiler cache when there is one (scripts/install-deps.sh installs ccache): rebuilds of an
# unchanged file cost nothing.
LAUNCHER=()
if command -v ccache >/dev/null 2>&1; then
  LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi

# Each stage's start, in seconds since this script began (CI keeps to 45 minutes on 2 cores).
stage() { echo "== $1 (at ${SECONDS} s)"; }

stage "release build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DQSPEC_CUDA_ARCHS="$CUDA_ARCHS" -DQSPEC_UNIT_TESTS=OFF \
  "${LAUNCHER[@]}" >/dev/null
cmake --build build -j "$JOBS"
stage "release tests (end-to-end)"
bash scripts/setup-test-venv.sh         # the openai SDK for tests/python (ctest OpenaiClient.PythonSdk)
bash scripts/fetch-smollm2.sh build/qspec   # real chat model for tests/e2e/test_smollm2.cpp (not in git)
bash scripts/fetch-gemma3-270m.sh build/qspec   # second real model for tests/e2e/test_gemma3.cpp (not in git)
LABELS=e2e
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then LABELS="e2e|gpu"; fi
(cd build && ctest -j "$JOBS" --output-on-failure -L "$LABELS")

# The sanitizer build keeps line tables only (-g1: function names and lines in reports, no
# variable info): a quarter less compile time than -g on the heaviest test files, same code.
stage "sanitizer + fuzz build (clang: ASan + UBSan, libFuzzer coverage)"
FUZZERS=$(cd tests/fuzz && ls fuzz_*.cpp 2>/dev/null | sed 's/\.cpp$//')
CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DQSPEC_CUDA=OFF -DQSPEC_SANITIZE=ON -DQSPEC_FUZZ=ON \
  "${LAUNCHER[@]}" >/dev/null
# shellcheck disable=SC2086
cmake --build build-asan -j "$JOBS" --target qspec qspec_unit_tests $FUZZERS
stage "unit tests under the sanitizers"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest -j "$JOBS" --output-on-failure -L unit)

# The fuzz targets at once (each bounded in time, not in CPU): a crash, leak or sanitizer report
# fails the run, with its log.
stage "fuzz targets (libFuzzer, ${FUZZ_SECONDS}s each, at once)"
logs=$(mktemp -d)
names=() pids=()
for fuzzer in $FUZZERS; do
  corpus="tests/fuzz/corpus_${fuzzer#fuzz_}"
  work="$logs/corpus_$fuzzer"
  mkdir -p "$work"
  [ -d "$corpus" ] && cp -r "$corpus"/. "$work"/
  # -timeout: an input that runs a minute is a bug (a render that never ends), not a slow machine.
  ./build-asan/tests/"$fuzzer" -max_total_time="$FUZZ_SECONDS" -timeout=60 -print_final_stats=1 "$work" \
    >"$logs/$fuzzer.log" 2>&1 &
  names+=("$fuzzer") pids+=($!)
done
failed=0
for i in "${!pids[@]}"; do
  fuzzer=${names[$i]}
  if wait "${pids[$i]}"; then
    echo "$fuzzer:"; tail -n 3 "$logs/$fuzzer.log"
  else
    echo "$fuzzer FAILED:"; tail -n 60 "$logs/$fuzzer.log"; failed=1
  fi
done
rm -rf "$logs"
[ "$failed" = 0 ]
stage "all tests passed"
