#!/usr/bin/env bash
# Fills .deps/ (ignored by git) with what a GPU machine without Debian's packages needs to
# build the project: the nlohmann-json and CLI11 headers and GoogleTest's sources, copied
# from this machine's packages (run scripts/setup.sh first).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .deps && mkdir -p .deps/include
cp -r /usr/include/nlohmann /usr/include/CLI .deps/include/
cp -r /usr/src/googletest .deps/
du -sh .deps
