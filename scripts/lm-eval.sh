#!/usr/bin/env bash
# lm-eval (PyPI lm_eval) as a client of `qspec serve`: its local-completions model runs two
# custom tasks over the bundled data (scripts/lm-eval/: gsm_synth_mc, loglikelihood multiple
# choice; gsm_synth_gen, generate_until), then scripts/lm-eval/compare.py checks the
# loglikelihoods against `qspec eval ppl` and the generate score against `qspec eval gsm` on the
# same problems. No Hugging Face hub access: the tokenizer is the server's (/tokenize,
# tokenizer_backend=remote), the data local JSON.
#
#   bash scripts/lm-eval.sh [QSPEC] [LIMIT] [OUT]   (defaults: build/qspec, 400 problems, /tmp/qspec-lm-eval)
#   MODE=w4a16 COMPARE_DOCS=50 LM_EVAL_VENV=.venv-lmeval bash scripts/lm-eval.sh
#   MODEL=models/smollm2 TASKS=gsm8k_local bash scripts/lm-eval.sh build/qspec 50   (the GSM8K test set)
set -euo pipefail
cd "$(dirname "$0")/.."
QSPEC=${1:-build/qspec}
LIMIT=${2:-400}
OUT=${3:-/tmp/qspec-lm-eval}
MODE=${MODE:-w4a16}
MODEL=${MODEL:-models/gsm-synth-llama}
VENV=${LM_EVAL_VENV:-.venv-lmeval}
TASKS=${TASKS:-gsm_synth}  # gsm_synth (the model's eval_problems.jsonl) or gsm8k_local (data/gsm8k)
case $TASKS in
  gsm_synth) PROBLEMS=$MODEL/eval_problems.jsonl ;;
  gsm8k_local) PROBLEMS=data/gsm8k/gsm8k_test.jsonl ;;
  *) echo "TASKS must be gsm_synth or gsm8k_local"; exit 2 ;;
esac
LM_EVAL_VERSION=0.4.13

if ! "$VENV/bin/python" -c "import lm_eval" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "lm_eval==$LM_EVAL_VERSION"
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
rm -rf "$OUT" && mkdir -p "$OUT"

"$QSPEC" serve "$MODEL" --port 0 --mode "$MODE" --max-batch-size 8 --no-access-log 2> "$OUT/serve.log" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
PORT=
for _ in $(seq 600); do
  PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$OUT/serve.log")
  [ -n "$PORT" ] && break
  kill -0 $SERVER 2>/dev/null || { cat "$OUT/serve.log"; exit 1; }
  sleep 0.1
done
[ -n "$PORT" ] || { echo "qspec serve did not start"; cat "$OUT/serve.log"; exit 1; }
NAME=$(basename "$MODEL")

"$VENV/bin/lm-eval" run --model local-completions \
  --model_args "model=$NAME,base_url=http://127.0.0.1:$PORT/v1/completions,tokenizer_backend=remote,num_concurrent=4,max_retries=1" \
  --tasks "${TASKS}_mc,${TASKS}_gen" --include_path scripts/lm-eval --limit "$LIMIT" \
  --output_path "$OUT/lm-eval" --log_samples 2>&1 | grep -v "Requesting API\|Tokenizing inputs" | tee "$OUT/lm-eval.log"

"$QSPEC" eval gsm "$MODEL" "$PROBLEMS" --modes "$MODE" --limit "$LIMIT" -o "$OUT/eval-gsm.json" > "$OUT/eval-gsm.log" 2>&1
"$VENV/bin/python" scripts/lm-eval/compare.py --qspec "$QSPEC" --model "$MODEL" --mode "$MODE" --tasks "$TASKS" \
  --lm-eval-dir "$OUT/lm-eval" --eval-gsm "$OUT/eval-gsm.json" --docs "${COMPARE_DOCS:-50}" | tee "$OUT/compare.txt"
