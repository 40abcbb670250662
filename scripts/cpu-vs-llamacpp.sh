#!/usr/bin/env bash
# qspec's CPU bench and llama.cpp's llama-bench side by side on one machine, alternated A B A B
# (a shared machine's load moves between runs), with each run's load average; then the medians
# (scripts/cpu-vs-llamacpp-summary.py). llama-bench runs twice a round: as it comes, and with
# `--poll 0` (its threads sleep instead of spinning at barriers, which a shared machine punishes).
# llama-bench is built from the tree of ../shared/peers/make-llamacpp-tree.sh (see
# ../shared/peers/README.md), outside this repository.
#
# usage: scripts/cpu-vs-llamacpp.sh LLAMA_BENCH QSPEC MODEL_DIR GGUF OUT_PREFIX [ROUNDS [THREADS [PROMPT [DECODE]]]]
#   writes OUT_PREFIX.log (every run's output, `== round N qspec|llama.cpp` headers, uptime lines)
#   and OUT_PREFIX.json (the summary)
# Example:
#   scripts/cpu-vs-llamacpp.sh /work/bench-llamacpp/lc/build/bin/llama-bench build-cpu/qspec models/smollm2 \
#     models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf bench/results/cpu-vs-llamacpp-smollm2-COMMIT 5
set -uo pipefail
(( $# >= 5 )) || { sed -n 2,12p "$0"; exit 2; }
llama_bench=$1 qspec=$2 model=$3 gguf=$4 prefix=$5
rounds=${6:-5} threads=${7:-2} prompt=${8:-64} decode=${9:-64}
modes=${QSPEC_MODES:-w4a16,w4a8}
for f in "$llama_bench" "$qspec"; do [[ -x $f ]] || { echo "$f: not an executable" >&2; exit 2; }; done
[[ -d $model ]] || { echo "$model: not a model directory" >&2; exit 2; }
[[ -f $gguf ]] || { echo "$gguf: no such GGUF file" >&2; exit 2; }
log=$prefix.log
mkdir -p "$(dirname "$prefix")"
{
  echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) ($(nproc) cores)"
  echo "# $("$qspec" --version 2>/dev/null | head -1) at $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
  echo "# rounds $rounds, threads $threads, prompt $prompt, decode $decode, qspec modes $modes"
  echo "# qspec: $qspec -t $threads bench $model --modes $modes --prompt-tokens $prompt --decode-tokens $decode --repeats 3"
  echo "# llama.cpp: $llama_bench -m $gguf -t $threads [--poll 0] -p $prompt -n $decode -r 3 -o md"
} > "$log"
for round in $(seq 1 "$rounds"); do
  # Odd rounds start with qspec, even rounds with llama.cpp.
  order=(qspec llama.cpp "llama.cpp --poll 0")
  (( round % 2 == 0 )) && order=("llama.cpp --poll 0" llama.cpp qspec)
  for which in "${order[@]}"; do
    echo "== round $round $which" >> "$log"
    echo "uptime: $(uptime)" >> "$log"
    if [[ $which == qspec ]]; then
      "$qspec" -t "$threads" bench "$model" --modes "$modes" --prompt-tokens "$prompt" --decode-tokens "$decode" \
        --repeats 3 >> "$log" 2>&1
    else
      extra=(); [[ $which == *poll* ]] && extra=(--poll 0)
      "$llama_bench" -m "$gguf" -t "$threads" "${extra[@]}" -p "$prompt" -n "$decode" -r 3 -o md >> "$log" 2>&1
    fi
    echo "uptime after: $(uptime)" >> "$log"
  done
done
python3 "$(dirname "$0")/cpu-vs-llamacpp-summary.py" "$log" > "$prefix.json" && cat "$prefix.json"
