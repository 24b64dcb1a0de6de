#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks, creates the project's Python environment
# (PyTorch 2.11 from PyPI, whose libtorch the C++ code builds against), configures and builds
# the project in ./build, and installs the Python package `streamplan`, whose extension module
# that build holds, into the environment. Safe to run again: finished steps are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build git python3 python3-venv python3-pip python3-dev
          nlohmann-json3-dev libcli11-dev libgtest-dev clang libclang-rt-14-dev libgloo-dev)
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

# One build for the command, the tests and the Python package's extension module.
prefix=$(.venv/bin/python -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DSTREAMPLAN_PYTHON_PACKAGE=ON -DPython_EXECUTABLE="$PWD/.venv/bin/python" >/dev/null
cmake --build build --parallel "$(nproc)"

# The package (pyproject.toml) builds against the environment's torch, so without build
# isolation. Given the same build folder and options, scikit-build-core finds everything
# built already and installs the extension module with the package's sources.
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  .venv/bin/python -m pip install -q --no-build-isolation --no-deps -C build-dir=build \
  -C cmake.define.STREAMPLAN_TESTS=ON -C cmake.define.STREAMPLAN_CLI=ON .
