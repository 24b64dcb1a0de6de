#!/usr/bin/env bash
# Builds the libFuzzer target with clang in ./build-fuzz and fuzzes for $1 seconds (default 60)
# on a scratch copy of fuzz/corpus. The fuzzer's own output (thousands of NEW/REDUCE lines)
# goes to a log file, build-fuzz/fuzz.log or $FUZZ_LOG; the script prints the log's last
# status line. Exits nonzero if the fuzzer finds a crash, after printing the end of the log;
# the crashing input is kept in build-fuzz/artifacts/.
#
#   fuzz/run.sh 30
#   FUZZ_JOBS=4 fuzz/run.sh 600      # parallel workers
#   FUZZ_LOG=/tmp/fuzz.log fuzz/run.sh
#
# Needs clang++ (14+), cmake, nlohmann-json3-dev and the libFuzzer runtime (Debian/Ubuntu:
# libclang-rt-14-dev), which is installed below with apt-get when it is missing.
set -euo pipefail

secs="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${FUZZ_BUILD_DIR:-$root/build-fuzz}"
cxx="${FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || true)}"
[[ -n "$cxx" ]] || { echo "run.sh: clang++ not found (apt-get install clang)" >&2; exit 2; }

# Make sure -fsanitize=fuzzer links; install the runtime if it does not.
probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe/p.cpp"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" 2>/dev/null; then
  echo "run.sh: libFuzzer runtime missing; installing libclang-rt-14-dev" >&2
  sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq && $sudo apt-get install -y -qq libclang-rt-14-dev
fi

gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$root/fuzz" -B "$build" "${gen[@]}" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTREAMPLAN_FUZZ=ON >/dev/null
cmake --build "$build" --target safetensors_fuzz >"$build/build.log" 2>&1 ||
  { tail -n 40 "$build/build.log" >&2; echo "run.sh: building the fuzz target failed (log: $build/build.log)" >&2; exit 2; }
log="${FUZZ_LOG:-$build/fuzz.log}"
mkdir -p "$(dirname "$log")"

# Fuzz a copy so that new inputs never land in the committed corpus.
work="$build/corpus-run"
rm -rf "$work" && mkdir -p "$work" "$build/artifacts"
cp "$root"/fuzz/corpus/* "$work"/

jobs="${FUZZ_JOBS:-1}"
extra=(); [[ "$jobs" -gt 1 ]] && extra=(-fork="$jobs")
echo "run.sh: fuzzing for ${secs}s, log in $log"
rc=0
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}" \
"$build/safetensors_fuzz" "$work" \
  -dict="$root/fuzz/safetensors.dict" \
  -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
  -artifact_prefix="$build/artifacts/" -print_final_stats=1 "${extra[@]}" >"$log" 2>&1 || rc=$?
# libFuzzer's status lines start with "#<executions>": coverage, corpus size, speed.
status_line=$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)
[[ -n "$status_line" ]] && echo "run.sh: $status_line"
if [[ $rc -ne 0 ]]; then
  tail -n 40 "$log" >&2
  echo "run.sh: the fuzzer failed (exit $rc) within ${secs}s; crashing inputs in $build/artifacts/, log in $log" >&2
  exit 1
fi
echo "run.sh: no crash in ${secs}s"
