#!/usr/bin/env bash
# The GPU machine's half of an A/B (scripts/ab-prepare.sh made .ab/): builds the baseline, then
# the working tree, in one build tree (the second build recompiles only what differs), keeping
# each one's binaries in .ab/bin-base and .ab/bin-new. Then AB_ROUNDS rounds of AB_COMMAND, run
# with BIN=.ab/bin-base and BIN=.ab/bin-new in turn (the order swapped every round), each run's
# output in $OUT/ab-<round>-<which>.log.
#
# usage: AB_COMMAND='$BIN/qspec bench ...' [AB_ROUNDS=2] scripts/gpu-ab.sh [DEPS_PREFIX] [TARGETS...]
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
deps=${1:-.deps}
shift || true
targets=("$@")
(( ${#targets[@]} )) || targets=(qspec)
deps_arg=()
[[ -d $deps ]] && deps_arg=(-DQSPEC_DEPS_PREFIX="$(cd "$deps" && pwd)")
build() {  # $1: which
  local start=$(date +%s)
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DQSPEC_CUDA=ON -DQSPEC_CUDA_ARCHS=90a -DQSPEC_SERVER=OFF \
    "${deps_arg[@]}" >> "$out/ab-build.log" 2>&1 && ninja -C build -j"$(nproc)" "${targets[@]}" >> "$out/ab-build.log" 2>&1 ||
    { echo "build $1 failed"; grep -E "error|FAILED" -A3 "$out/ab-build.log" | head -40; exit 1; }
  mkdir -p ".ab/bin-$1"
  for t in "${targets[@]}"; do find build -maxdepth 2 -type f -name "$t" -perm -u+x -exec cp {} ".ab/bin-$1/" \; ; done
  echo "build $1: $(( $(date +%s) - start )) s"
}
# The working tree's versions of every file the swap touches, kept aside.
tar tf .ab/base.tar | grep -v '/$' | sed 's#^\./##' > .ab/base_files.txt
cat .ab/base_files.txt .ab/added.txt | while read -r f; do [[ -f $f ]] && echo "$f"; done > .ab/new_files.txt
tar cf .ab/new.tar -T .ab/new_files.txt
# Baseline: its files (mtimes now, so ninja rebuilds them), the added ones gone.
xargs -a .ab/added.txt rm -f
tar xmf .ab/base.tar
build base
# The working tree again.
xargs -a .ab/base_files.txt rm -f
tar xmf .ab/new.tar
build new
rounds=${AB_ROUNDS:-2}
for (( r = 0; r < rounds; ++r )); do
  order=(base new)
  (( r % 2 )) && order=(new base)
  for which in "${order[@]}"; do
    start=$(date +%s%N)
    BIN=.ab/bin-$which bash -c "$AB_COMMAND" > "$out/ab-$r-$which.log" 2>&1
    echo "round $r $which: rc=$? $(( ($(date +%s%N) - start) / 1000000 )) ms"
  done
done
