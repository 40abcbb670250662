#!/usr/bin/env bash
# Installs what qspec needs to build and test on Debian 12 (bookworm) or newer.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake ninja-build pkg-config git ca-certificates \
  libpcre2-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libcpp-httplib-dev libssl-dev openssl \
  clang libclang-rt-14-dev ccache python3 python3-pip python3-venv curl tmux >/dev/null
echo "qspec: build dependencies installed"
