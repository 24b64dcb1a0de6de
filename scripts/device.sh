#!/usr/bin/env bash
# On a GPU machine with PyTorch 2.11 installed: builds against that PyTorch's libtorch, runs
# the test suite (CPU and CUDA tests) and the GPU runs, writes JSON into OUT and prints a
# short table last.
#
#   scripts/device.sh OUT
#
# Header-only dependencies and GoogleTest's sources are taken from .deps/ when the machine
# has no packages for them (scripts/device-deps.sh fills it on a Debian machine).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/device.sh OUT}"
mkdir -p "$out"
py=${PYTHON:-python3}
prefix=$($py -c 'import torch; print(torch.utils.cmake_prefix_path)')
extra=()
[ -d .deps/include ] && extra+=(-DCMAKE_INCLUDE_PATH="$PWD/.deps/include" -DCMAKE_PREFIX_PATH="$prefix;$PWD/.deps")
[ -d .deps/googletest ] && extra+=(-DSTREAMPLAN_GTEST_SRC="$PWD/.deps/googletest")
[ ${#extra[@]} -eq 0 ] && extra+=(-DCMAKE_PREFIX_PATH="$prefix")
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  $py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release "${extra[@]}"
  cmake --build build-gpu --parallel "$(nproc)"
} >"$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }

ctest --test-dir build-gpu --output-on-failure --parallel 4 --timeout 900 >"$out/ctest.log" 2>&1 \
  && tests="passed" || tests="FAILED"
grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/ctest.log" | tail -15 || true
grep -E "naive err|^(bf16|fp16)" "$out/ctest.log" | head -10 || true

bin=build-gpu/streamplan
runs=("demo --device cuda --tokens 16384 --json"
      "demo --device cuda --tokens 16384 --dtype bf16 --json"
      "demo --device cuda --tokens 65536 --dtype bf16 --json")
names=(demo_16384_fp32 demo_16384_bf16 demo_65536_bf16)
for i in "${!runs[@]}"; do
  $bin ${runs[$i]} >"$out/${names[$i]}.json" 2>"$out/${names[$i]}.err" || echo "${names[$i]}: exit $?"
done

$py - "$out" "$tests" "${names[@]}" <<'PY'
import json, sys, os
out, tests, names = sys.argv[1], sys.argv[2], sys.argv[3:]
print(f"\ntest suite: {tests}")
print(f"{'run':18} {'tokens':>7} {'naive MiB':>10} {'planned MiB':>12} {'floor MiB':>10} {'est/meas':>9} {'p/n time':>9} {'rel_l2':>9}")
for n in names:
    try:
        r = json.load(open(os.path.join(out, n + ".json")))
    except Exception as e:
        print(f"{n:18} failed: {e}"); continue
    M = 1 << 20
    nv, pl = r["naive"], r["planned"]
    print(f"{n:18} {r['tokens']:>7} {nv['peak_bytes']/M:>10.1f} {pl['peak_bytes']/M:>12.1f} {r['floor_bytes']/M:>10.1f} "
          f"{pl['estimated_peak_bytes']/pl['peak_bytes']:>9.4f} {pl['ms']/nv['ms']:>9.3f} {r['error']['rel_l2']:>9.2e}")
PY
