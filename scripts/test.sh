#!/usr/bin/env bash
# Builds the project (setting it up first where needed) and runs every test suite: CTest, the
# pytest suites (tests/python: the Python package, installed in .venv; the plain-torch MiniMax
# H3 reference and streamplan's H3 forward against it, tests/reference/test_minimax_h3_*.py), then a
# bounded fuzzing run of the checkpoint reader. Each suite prints a short report (the fuzzer's
# log goes to build/fuzz.log, pytest's to build/pytest.log) and adds one entry to the summary
# line printed last,
#   streamplan tests: ctest 100/130 passed, 30 skipped, pytest 150 passed, 3 skipped, fuzz 60 s without a crash
# (pytest's entry counts failures and errors too where there are any; each skip's reason is in
# pytest's short summary). The ComfyUI tests import ../shared/comfyui-* where .deps/comfyui* is
# missing (tests/reference/comfy_tree.py).
# The exit status is nonzero when any suite failed.
#
#   scripts/test.sh
#   FUZZ_SECONDS=10 scripts/test.sh          # a shorter fuzzing run
#   BUILD_DIR=../build-x scripts/test.sh     # an already configured build instead of ./build
#                                            # (and the package as installed in .venv)
#
# A suite is a function suite_<name> that returns nonzero on failure and appends its entry to
# `summary`; adding one means adding the function and its name to `suites`.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

build="${BUILD_DIR:-build}"
# Ninja's progress lines ("[12/130] Building CXX object ...") are dropped; errors stay.
without_progress() { grep -vE '^\[[0-9]+/[0-9]+\] '; }
if [ -z "${BUILD_DIR:-}" ]; then
  scripts/setup.sh 2>&1 | without_progress
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "streamplan tests: setup or build failed" >&2; exit 1; }
else
  cmake --build "$build" 2>&1 | without_progress
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "streamplan tests: build of $build failed" >&2; exit 1; }
fi

summary=()

suite_ctest() {
  local log="$build/ctest.log" rc line total failed skipped
  # One line per finished test; the "Start" line of each stays in the log.
  ctest --test-dir "$build" --output-on-failure --parallel "$(nproc)" --timeout 1200 2>&1 | tee "$log" |
    grep -vE '^ +Start +[0-9]+: '
  rc=${PIPESTATUS[0]}
  # "100% tests passed, 0 tests failed out of 130"
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1)
  if [ -z "$line" ]; then
    summary+=("ctest did not finish (exit $rc)")
    return 1
  fi
  total=$(sed -E 's/.* out of ([0-9]+).*/\1/' <<<"$line")
  failed=$(sed -E 's/.*passed, ([0-9]+) tests? failed.*/\1/' <<<"$line")
  # CTest counts a skipped test among the passed ones: its "***Skipped" lines are counted apart.
  skipped=$(grep -cE '\*\*\*Skipped' "$log" || true)
  summary+=("ctest $((total - failed - skipped))/$total passed, $skipped skipped")
  return "$rc"
}

suite_pytest() {
  local log="$build/pytest.log" rc line passed failed errors skipped entry
  # Attaching probes the device; the rates a probe measures while tests run stay with the tests.
  XDG_CACHE_HOME="$(cd "$build" && pwd)/test-cache" .venv/bin/python -m pytest -q -rfEs -p no:cacheprovider tests/python \
    tests/reference/test_minimax_h3_reference.py tests/reference/test_minimax_h3_streamplan.py 2>&1 |
    tee "$log"
  rc=${PIPESTATUS[0]}
  # "38 passed in 61.2s", "2 failed, 36 passed, 1 error in 70.0s"
  line=$(grep -E '^=* *([0-9]+ (passed|failed|errors?|skipped)(, )?)+.* in [0-9.]+s' "$log" | tail -n 1)
  if [ -z "$line" ]; then
    summary+=("pytest did not finish (exit $rc)")
    return 1
  fi
  count() { grep -oE "[0-9]+ $1" <<<"$line" | grep -oE '[0-9]+' || echo 0; }
  passed=$(count passed)
  failed=$(count failed)
  errors=$(count 'errors?')
  skipped=$(count skipped)
  entry="pytest $passed passed"
  [ "$failed" -eq 0 ] || entry+=", $failed failed"
  [ "$errors" -eq 0 ] || entry+=", $errors errors"
  entry+=", $skipped skipped"
  summary+=("$entry")
  return "$rc"
}

suite_fuzz() {
  local secs="${FUZZ_SECONDS:-60}"
  if FUZZ_LOG="$build/fuzz.log" fuzz/run.sh "$secs"; then
    summary+=("fuzz $secs s without a crash")
  else
    summary+=("fuzz FAILED (log: $build/fuzz.log)")
    return 1
  fi
}

suites=(ctest pytest fuzz)
status=0
for s in "${suites[@]}"; do
  echo "== $s"
  "suite_$s" || status=1
done
line=$(printf '%s, ' "${summary[@]}")
line="streamplan tests: ${line%, }"
[ "$status" -eq 0 ] || line+="; FAILED"
echo "$line"
exit "$status"
