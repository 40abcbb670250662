#!/usr/bin/env bash
# Copies this worktree's sources (and a bundled deps prefix) into the checkout the device tool
# sends (DEST, default /work/main/.devcuda, which that checkout's .git/info/exclude ignores).
# On the device: cd .devcuda/src-tree && QSPEC_COMMIT=$(cat ../COMMIT) scripts/gpu-run.sh ../deps
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-/work/main/.devcuda}
mkdir -p "$dest/src-tree"
rm -rf "$dest/src-tree" && mkdir -p "$dest/src-tree"
excludes=(--exclude='./build*' --exclude=./.git --exclude=./.devcuda --exclude=./.devrun --exclude='./.venv*' --exclude=./.whl --exclude=./models/smollm2 --exclude=./gpu-out)
# The GPU tests need models/gsm-synth-llama only; the CPU test data stays behind (the whole
# send, the main checkout included, must stay under 64 MiB).
excludes+=(--exclude=./tests/data --exclude=./data --exclude=./models/stories260K --exclude=./bench/results)
[[ -n ${SYNC_EXCLUDE_MODELS:-} ]] && excludes+=(--exclude=./models)
tar -C "$src" "${excludes[@]}" -cf - . | tar -C "$dest/src-tree" -xf -
[[ -d $dest/deps ]] || "$src/scripts/bundle-deps.sh" "$dest/deps"
(cd "$src" && git rev-parse HEAD && git status --porcelain | grep -q . && echo dirty) | paste -sd' ' > "$dest/COMMIT" || true
du -sh "$dest"
