#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks, creates the project's Python environment
# (PyTorch 2.11 from PyPI, whose libtorch the C++ code builds against) and configures and
# builds the project in ./build. Safe to run again: finished steps are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build git python3 python3-venv python3-pip
          nlohmann-json3-dev libcli11-dev libgtest-dev clang libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q "${missing[@]}"
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# Reinstall whenever requirements.txt changed since the last install.
stamp=.venv/.requirements.sha256
if ! sha256sum -c --status "$stamp" 2>/dev/null; then
  .venv/bin/pip install -q -r requirements.txt
  sha256sum requirements.txt >"$stamp"
fi

prefix=$(.venv/bin/python -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build --parallel "$(nproc)"
