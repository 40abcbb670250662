#!/usr/bin/env bash
# A/B of one environment switch in `qspec bench --device cuda`, on one machine in one call: the
# values in turn, ROUNDS rounds (the order reversed on even rounds), every table to
# $OUT/ab-VAR.log and round 1's JSON to $OUT/VAR-VALUE/. Needs ./build/qspec (scripts/gpu-run.sh
# builds it).
# usage: scripts/gpu-env-ab.sh VAR "VALUE1 VALUE2 ..." ROUNDS [qspec bench args...]
# Export QSPEC_COMMIT (the commit the sources are) first: the JSON records it, and the GPU
# machine's copy of the tree may carry a stale .git whose HEAD is another commit.
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
var=${1:?usage: $0 VAR VALUES ROUNDS [bench args]}
read -r -a values <<< "${2:?values}"
rounds=${3:?rounds}
shift 3
log="$out/ab-$var.log"
for (( round = 1; round <= rounds; ++round )); do
  order=("${values[@]}")
  if (( round % 2 == 0 )); then
    order=(); for (( i = ${#values[@]} - 1; i >= 0; --i )); do order+=("${values[i]}"); done
  fi
  for value in "${order[@]}"; do
    json_dir=""
    (( round == 1 )) && json_dir="$out/$var-$value" && mkdir -p "$json_dir"
    echo "== round $round, $var=$value" >> "$log"
    env "$var=$value" timeout "${AB_BENCH_TIMEOUT:-150}" ./build/qspec bench --device cuda "$@" --out-dir "$json_dir" >> "$log" 2>&1
    echo "== round $round, $var=$value: rc=$?"
  done
done
# The tables' data rows, each under its run's header.
grep -E "^== round|^ +[0-9]+ +[0-9.]+ +[0-9]+ +[0-9.]+ +[0-9.]+%|^ +[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+ " "$log"
