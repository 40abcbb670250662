#!/usr/bin/env bash
# One decode step's timeline on the GPU machine (nsys from Nsight Compute, its importer's missing
# libraries carried in LIBS, tools/nsys_timeline.py over the capture), once for each value of an
# environment switch. Needs ./build/qspec. Writes $OUT/timeline-VALUE.txt.
# usage: scripts/gpu-timeline.sh LIBS VAR "VALUE1 VALUE2 ..." [qspec bench args, e.g. --batch-sizes 1]
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
libs=$(cd "${1:?usage}" && pwd); var=${2:?var}; read -r -a values <<< "${3:?values}"; shift 3
nsys=$(ls /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys | head -1)
importer=$(ls /opt/nvidia/nsight-compute/*/host/linux-desktop-glibc_2_11_3-x64/QdstrmImporter | head -1)
work=$(mktemp -d)
for value in "${values[@]}"; do
  env "$var=$value" "$nsys" profile -t cuda --cuda-graph-trace=node --capture-range=cudaProfilerApi \
    -o "$work/step-$value" ./build/qspec bench --device cuda --synthetic llama3-8b --modes w4a16 --profile-step \
    --prompt-lengths 128 --out-dir '' "$@" > "$work/nsys-$value.log" 2>&1
  [[ -f $work/step-$value.nsys-rep ]] || LD_LIBRARY_PATH=$libs "$importer" -i "$work/step-$value.qdstrm" >> "$work/nsys-$value.log" 2>&1
  "$nsys" export --type sqlite -o "$work/step-$value.sqlite" "$work/step-$value.nsys-rep" >> "$work/nsys-$value.log" 2>&1
  python3 tools/nsys_timeline.py "$work/step-$value.sqlite" > "$out/timeline-$value.txt" 2>&1 ||
    tail -20 "$work/nsys-$value.log" >> "$out/timeline-$value.txt"
  echo "== $var=$value"; head -14 "$out/timeline-$value.txt"
done
