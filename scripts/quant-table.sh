#!/usr/bin/env bash
# The quantization results table for the bundled gsm-synth-llama (400 eval problems, greedy):
# exact match and problem-text perplexity for W16A16 and every 4-bit mode, RTN and GPTQ,
# with and without ARCQuant, all 4-bit modes of one row family from ONE 4-bit weight set.
# Usage: scripts/quant-table.sh [QSPEC_BINARY] [OUT_DIR]   (about 1 hour on 2 cores)
set -euo pipefail
QSPEC=${1:-build/qspec}
OUT=${2:-bench/results}
MODEL=models/gsm-synth-llama
CALIB=data/calibration/gsm-synth-self.txt
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
CAL=(--calib "$CALIB" --calib-samples 128 --calib-length 256)
"$QSPEC" quantize "$MODEL" "$WORK/int4-rtn-arc" --format int4 --arc "${CAL[@]}"
"$QSPEC" quantize "$MODEL" "$WORK/int4-gptq-arc" --format int4 --method gptq --arc "${CAL[@]}"
"$QSPEC" eval gsm "$MODEL" --modes w16a16 -o "$OUT/quant-table-w16a16.json"
"$QSPEC" eval gsm "$WORK/int4-rtn-arc" \
  --modes w4a16,w4a8,w4a8-fp8,w4a4-int4,w4a4-int4-arc,w4a4-nvfp4,w4a4-nvfp4-arc,w4a4-mxfp4,w4a4-mxfp4-arc \
  -o "$OUT/quant-table-int4-rtn-arc.json"
"$QSPEC" eval gsm "$WORK/int4-gptq-arc" \
  --modes w4a16,w4a8,w4a4-int4,w4a4-int4-arc,w4a4-nvfp4,w4a4-nvfp4-arc,w4a4-mxfp4,w4a4-mxfp4-arc \
  -o "$OUT/quant-table-int4-gptq-arc.json"
