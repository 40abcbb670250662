#!/usr/bin/env bash
# One device call for what this tree left unrun on a GPU (docs/perf-journal/perf-notes-journal-2026.md, "Verify steps as
# CUDA graphs"): build, the whole `gpu` label with verify graphs forced on (QSPEC_VERIFY_GRAPHS=1:
# the new VerifyGraphsAgreeWithPlainLaunches test and every QSpec == W4A16 test over them), then
# the QSpec cycle benchmark with and without them, alternating, two rounds. Logs and JSON to $OUT.
# usage (source root, deps bundled by scripts/bundle-deps.sh): scripts/gpu-verify-graphs-ab.sh DEPS [COMMIT]
# env: AB_STEPS (parts), AB_ROUNDS (benchmark rounds, default 2), AB_BENCH_TIMEOUT (seconds a run)
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
deps=${1:-.deps}
export QSPEC_COMMIT=${2:-${QSPEC_COMMIT:-unknown}}
# AB_STEPS picks the parts (default all): a build plus the tests fit one 10-minute call, the
# benchmark rounds a second one on the same warm machine.
steps=${AB_STEPS:-"build test bench"}
if [[ $steps == *build* ]]; then GPU_RUN_STEPS=build scripts/gpu-run.sh "$deps" || exit $?; fi
if [[ $steps == *test* ]]; then
  start=$(date +%s)
  QSPEC_VERIFY_GRAPHS=1 ./build/tests/qspec_gpu_tests > "$out/gpu_tests.log" 2>&1
  echo "gpu tests (verify graphs on) rc=$? in $(( $(date +%s) - start )) s"
  grep -E "^\[  (FAILED|PASSED) |Failure|identical|400 / 400" "$out/gpu_tests.log" | head -40
fi
[[ $steps == *bench* ]] || exit 0
# The benchmark rounds through the generic A/B script (log and round 1's JSON under $out).
scripts/gpu-env-ab.sh QSPEC_VERIFY_GRAPHS "0 1" "${AB_ROUNDS:-2}" --synthetic llama3-8b --modes w4a16 \
  --batch-sizes 1,16,32 --prompt-lengths 128 --steps 32 --qspec-gammas 1,2,4 --qspec-drafts w4a8
