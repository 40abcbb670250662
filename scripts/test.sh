#!/usr/bin/env bash
# Builds qspec and runs its tests: the release build with every CPU test (unit + end-to-end),
# the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer, and each fuzz
# target for a bounded time. GPU tests (ctest label `gpu`) run only where a GPU is present.
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
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DQSPEC_CUDA_ARCHS="$CUDA_ARCHS" "${LAUNCHER[@]}" >/dev/null
cmake --build build -j "$JOBS"
stage "release tests"
bash scripts/setup-test-venv.sh         # the openai SDK for tests/python (ctest OpenaiClient.PythonSdk)
bash scripts/fetch-smollm2.sh build/qspec   # real chat model for tests/e2e/test_smollm2.cpp (not in git)
bash scripts/fetch-gemma3-270m.sh build/qspec   # second real model for tests/e2e/test_gemma3.cpp (not in git)
GPU_FILTER=(-LE gpu)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then GPU_FILTER=(); fi
(cd build && ctest -j "$JOBS" --output-on-failure "${GPU_FILTER[@]}")

# The sanitizer and fuzz builds keep line tables only (-g1: function names and lines in reports, no
# variable info): a quarter less compile time than -g on the heaviest test files, same code.
DEBUG_LINES=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG")

stage "sanitizer build (ASan + UBSan), unit tests"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${DEBUG_LINES[@]}" -DQSPEC_CUDA=OFF -DQSPEC_SANITIZE=ON "${LAUNCHER[@]}" >/dev/null
cmake --build build-asan -j "$JOBS" --target qspec qspec_unit_tests
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest -j "$JOBS" --output-on-failure -L unit)

stage "fuzz targets (libFuzzer, ${FUZZ_SECONDS}s each)"
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${DEBUG_LINES[@]}" -DQSPEC_CUDA=OFF \
  -DQSPEC_SANITIZE=ON -DQSPEC_FUZZ=ON -DQSPEC_BUILD_TESTS=ON -DQSPEC_NATIVE=ON "${LAUNCHER[@]}" >/dev/null
FUZZERS=$(cd tests/fuzz && ls fuzz_*.cpp 2>/dev/null | sed 's/\.cpp$//')
for fuzzer in $FUZZERS; do
  cmake --build build-fuzz -j "$JOBS" --target "$fuzzer"
  corpus="tests/fuzz/corpus_${fuzzer#fuzz_}"
  work=$(mktemp -d)
  [ -d "$corpus" ] && cp -r "$corpus"/. "$work"/
  # -timeout: an input that runs a minute is a bug (a render that never ends), not a slow machine.
  ./build-fuzz/tests/"$fuzzer" -max_total_time="$FUZZ_SECONDS" -timeout=60 -print_final_stats=1 "$work" 2>&1 | tail -n 3
  rm -rf "$work"
done
stage "all tests passed"
