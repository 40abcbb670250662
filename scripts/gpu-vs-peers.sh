#!/usr/bin/env bash
# qspec's W4A16 decode against the engines a user would pick instead, on one GPU in one call:
# qspec bench, PyTorch (peer_decode.py: bf16 on cuBLAS and tinygemm W4A16, CUDA graphs) and
# llama.cpp CUDA Q4_0 (llama-bench, llama-batched-bench), all at Llama-3-8B shapes with random
# weights, context 512; qspec runs first and last, so a drift of the GPU shows in its two runs.
# The peers are ../shared/peers' scripts and llama.cpp tree (not part of this project): pass
# the folder that holds them. Summarise with scripts/gpu-vs-peers-summary.py.
#
# usage (source root, on the GPU machine): scripts/gpu-vs-peers.sh QSPEC_BIN PEERS_DIR OUT_DIR
#   PEERS_DIR: peer_decode.py, gen_random_gguf.py and llamacpp-tree.tar.xz
#   (../shared/peers/make-llamacpp-tree.sh PEERS_DIR makes the tree)
set -uo pipefail
qspec=$1; peers=$(cd "$2" && pwd); out=$(mkdir -p "$3" && cd "$3" && pwd)
batches=1,8,16,32,64
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
work=$(mktemp -d); tar xJf "$peers/llamacpp-tree.tar.xz" -C "$work" || exit 1
# llama.cpp's build (CPU-bound) runs beside the GGUF writer; nothing is timed meanwhile.
( cd "$work/lc" && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF > "$out/llamacpp-build.log" 2>&1 &&
  ninja -C build -j"$(nproc)" llama-bench llama-batched-bench >> "$out/llamacpp-build.log" 2>&1 ) &
build=$!
python3 "$peers/gen_random_gguf.py" "$work/lc/gguf-py" "$work/random-llama3-8b-q4_0.gguf" > "$out/gguf.log" 2>&1 || exit 1
wait $build || { tail -20 "$out/llamacpp-build.log"; exit 1; }
el "llama.cpp built, GGUF written"
bench_qspec() {  # $1: run name
  "$qspec" bench --device cuda --synthetic llama3-8b --modes w4a16 --batch-sizes $batches --context 512 \
    --prompt-lengths 512 --steps 64 -o "$out/qspec-$1" > "$out/qspec-$1.log" 2>&1
  el "qspec $1 rc=$?"
}
bench_qspec a
python3 "$peers/peer_decode.py" llama3-8b 512 $batches bf16,w4a16 > "$out/pytorch.jsonl" 2>"$out/pytorch.err"
el "pytorch rc=$?"
bin=$work/lc/build/bin
"$bin/llama-bench" -m "$work/random-llama3-8b-q4_0.gguf" -p 512 -n 128 -ngl 99 -fa 1 -r 3 -o md > "$out/llamacpp-bench.md" 2>"$out/llamacpp-bench.err"
el "llama-bench rc=$?"
"$bin/llama-batched-bench" -m "$work/random-llama3-8b-q4_0.gguf" -c 40960 -b 2048 -ub 512 -npp 512 -ntg 128 -npl $batches \
  -ngl 99 -fa on > "$out/llamacpp-batched.log" 2>&1
el "llama-batched-bench rc=$?"
bench_qspec b
rm -rf "$work"
