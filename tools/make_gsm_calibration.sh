#!/usr/bin/env bash
# Calibration text for the bundled gsm-synth-llama model, sampled from the model itself
# (W16A16, temperature 1): in-distribution text that shares nothing with the eval problems.
# Usage: tools/make_gsm_calibration.sh [QSPEC_BINARY] > data/calibration/gsm-synth-self.txt
set -euo pipefail
QSPEC=${1:-build/qspec}
for seed in $(seq 1 256); do
  "$QSPEC" -t 1 generate models/gsm-synth-llama -p "Question:" -n 200 --temperature 1.0 --seed "$seed" 2>/dev/null
  printf '\n\n'
done
