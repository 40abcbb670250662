#!/usr/bin/env bash
# Prepares an A/B of two commits on the GPU machine (scripts/gpu-ab.sh) in one build tree: the
# baseline's versions of the files that differ from the working tree go into .ab/base.tar, the
# files the working tree adds into .ab/added.txt. Files named after BASE keep the working tree's
# version in both builds (e.g. a benchmark flag the baseline lacks). Run from the source root.
#
# usage: scripts/ab-prepare.sh BASE_COMMIT [PATH_KEPT ...]
set -euo pipefail
base=$1
shift
keep=" $* "
rm -rf .ab
mkdir -p .ab/base
grep -qx '/.ab/' .git/info/exclude 2>/dev/null || echo '/.ab/' >> .git/info/exclude
: > .ab/added.txt
git diff --name-status --no-renames "$base" -- src include tests CMakeLists.txt cmake | while read -r status path; do
  [[ $keep == *" $path "* ]] && continue
  case $status in
    A) echo "$path" >> .ab/added.txt ;;
    M|D) mkdir -p ".ab/base/$(dirname "$path")" && git show "$base:$path" > ".ab/base/$path" ;;
  esac
done
(cd .ab/base && tar cf ../base.tar .)
rm -rf .ab/base
git rev-parse --short "$base" > .ab/base_commit
echo "A/B against $(cat .ab/base_commit): $(tar tf .ab/base.tar | grep -vc '/$') baseline files, $(wc -l < .ab/added.txt) added files"
