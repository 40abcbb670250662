#!/usr/bin/env bash
# Copies this machine's build dependencies (Debian packages nlohmann-json3-dev, libcli11-dev,
# libgtest-dev, libgmock-dev, libpcre2-dev) into one prefix laid out like /usr, for a machine where they cannot
# be installed (the GPU machine has CUDA, CMake and ninja but no package registry). Configure
# there with -DQSPEC_DEPS_PREFIX=<prefix>. Only static libraries travel (about 4 MB in all).
#
# usage: scripts/bundle-deps.sh PREFIX
set -euo pipefail
prefix=${1:?usage: $0 PREFIX}
arch=$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)
lib=/usr/lib/$arch
for f in /usr/include/nlohmann /usr/include/CLI /usr/include/gtest /usr/include/gmock /usr/include/pcre2.h \
         /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 $lib/cmake/GTest \
         $lib/libgtest.a $lib/libgtest_main.a $lib/libgmock.a $lib/libgmock_main.a $lib/libpcre2-8.a; do
  [[ -e $f ]] || { echo "bundle-deps: missing $f (install the Debian -dev packages first)" >&2; exit 1; }
done
rm -rf "$prefix"
mkdir -p "$prefix/include" "$prefix/share/cmake" "$prefix/lib/$arch/cmake"
cp -a /usr/include/nlohmann /usr/include/CLI /usr/include/gtest /usr/include/gmock /usr/include/pcre2.h "$prefix/include/"
cp -a /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 "$prefix/share/cmake/"
cp -a $lib/cmake/GTest "$prefix/lib/$arch/cmake/"
# Static libraries only, so find_library cannot pick a shared one missing at run time there.
cp -a $lib/libgtest.a $lib/libgtest_main.a $lib/libgmock.a $lib/libgmock_main.a $lib/libpcre2-8.a "$prefix/lib/$arch/"
du -sh "$prefix"
