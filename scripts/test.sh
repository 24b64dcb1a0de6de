#!/usr/bin/env bash
# Builds the project (setting it up first where needed) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir build --output-on-failure --parallel "$(nproc)" --timeout 1200
fuzz/run.sh "${FUZZ_SECONDS:-60}"
