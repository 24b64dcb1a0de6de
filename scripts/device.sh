#!/usr/bin/env bash
# On a GPU machine with PyTorch 2.11 installed: builds against that PyTorch's libtorch, runs
# the test suite (CPU and CUDA tests), the GPU runs and the benchmarks, writes JSON into OUT
# and prints a short table last.
#
#   scripts/device.sh OUT            build, tests, demo, real-dimension family runs, bench
#                                    (blocks and Flux); copies the binary to OUT/streamplan
#   scripts/device.sh OUT test       build and the test suite only, then the GPU tests' figures
#   scripts/device.sh OUT models     bench of the whole MiniMax H3 and Wan models only, with the binary
#                                    at $STREAMPLAN_BIN (default build-gpu/streamplan; built
#                                    first where missing)
#   scripts/device.sh OUT sweep-models
#                                    budget sweeps of the whole MiniMax H3 (10 s) and Wan 14B models
#                                    from 1.1 x floor, against two fixed chunks (same binary)
#   scripts/device.sh OUT package    the Python package built here, then diffusers' WanPipeline
#                                    (Wan 2.1 14B widths, 2 layers) with and without
#                                    streamplan.apply (scripts/bench_package.py), and the Wan and
#                                    Flux bench cases against diffusers' own modules
#                                    (scripts/bench_peers.py)
#   scripts/device.sh OUT package-residency
#                                    the Python package built here, then diffusers' Wan transformer
#                                    (14B widths, 8 layers) held in host memory and attached with
#                                    device_memory (5 and 8 GiB), against the same module all on the
#                                    GPU (scripts/bench_package_residency.py)
#   scripts/device.sh OUT soak       the Python package built here, then 1,000 calls of diffusers' Wan
#                                    transformer (14B widths, 2 layers) through streamplan.apply on
#                                    random geometries: memory back at its baseline after every call,
#                                    the plan cache bounded (scripts/soak_package.py; OUT/soak.json)
#   scripts/device.sh OUT minimax    the Python package built here, then ComfyUI's MiniMaxH3Model
#                                    (2 blocks, 10 s at 1376x768) with and without
#                                    streamplan.apply (scripts/bench_minimax.py)
#   scripts/device.sh OUT comfy-check
#                                    the Python package built here, then ComfyUI's own sampling
#                                    of Wan 14B (2 layers) and Flux-dev (2 + 4 blocks) with and
#                                    without the node, and with a LoRA (scripts/comfy_check.py);
#                                    COMFY_FORMATS=fp8,int8,...: from checkpoints in those formats
#   scripts/device.sh OUT vram-check  whole models on an emulated 12 GiB card under ComfyUI's own
#                                    sampling, one process per configuration (ComfyUI alone capped,
#                                    with the planner dense and sparse, uncapped reference;
#                                    scripts/comfy_vram_check.py); VRAM_ARGS: its arguments
#                                    (default --model wan)
#   scripts/device.sh OUT sp-check    sequence parallel on the machine's GPUs: ComfyUI's Wan 14B
#                                    (40 layers, 81x1280x720, CFG; SP_ARGS="--model minimax": H3,
#                                    50 blocks, 10 s at 1376x768; --vs-comfy: rel L2 against
#                                    ComfyUI's own forward; --weights replicated,sharded: both
#                                    arrangements; --comm-time: NCCL kernel time; --solo: each count's
#                                    first rank alone on one GPU, its exchanges copying what it sends)
#                                    on 1 and 2 ranks (scripts/sp_check.py); SP_ARGS: its arguments
#                                    (OUT/sp_check.json)
#   scripts/device.sh OUT comfy-load  ComfyUI master's own loader and forward on the files
#                                    `streamplan convert` writes (fp8, int8, convrot-int8 of Wan 2.1
#                                    and Flux-dev checkpoints, both layouts; scripts/comfy_load_check.py);
#                                    builds first where build-gpu/streamplan is missing
#   scripts/device.sh OUT policy     the bench cases three ways, in turn in one process: the
#                                    default policy (no flags), --budget auto (the fastest plan)
#                                    and --budget-floor 1.1 (bench --policies); builds first
#                                    where build-gpu/streamplan is missing
#   scripts/device.sh OUT residency
#                                    weights streamed from host memory: the whole Wan 14B model under
#                                    8 GiB, the whole MiniMax H3 model (10 s) under 12 GiB and Flux-dev
#                                    at 1024^2 under 10, 16 and 24 GiB, each against the same plan with
#                                    every weight resident (bench --device-memory); builds first where
#                                    build-gpu/streamplan is missing
#   scripts/device.sh OUT attention  streamplan bench-attention (sdpa vs int8, sparse and a fixed window
#                                    at the Wan 14B and H3 10 s shapes; BENCH_ARGS e.g. "--distribution
#                                    all") into OUT/attention.json; builds first where
#                                    build-gpu/streamplan is missing
#   scripts/device.sh OUT formats    the block cases with their linears in each weight format (dense,
#                                    fp8-e4m3, convrot-int8, int8; FORMATS overrides), each with a
#                                    profiled run (the projections' time alone); then a rank-64 LoRA on
#                                    every linear of the Wan block, at the default policy and at 1.1 x floor
#                                    (LORA=0 skips it)
#   scripts/device.sh OUT consumers  the block cases (CASES; default the MiniMax H3 10 s and Wan 14B
#                                    blocks) with the int8 attention consumer and with sparse at KV
#                                    budget 0.3, 2 timed runs each at the default policy; builds first
#                                    where build-gpu/streamplan is missing
#   scripts/device.sh OUT stack      fp8 projections with 8-bit attention against the bf16 dense plan in one
#                                    process: the Wan 14B and H3 10 s blocks with int8 attention, the whole
#                                    H3 10 s model with sparse attention at 0.3 (STACK_CASES: case[,case]:consumer
#                                    ...); builds first where build-gpu/streamplan is missing
#   scripts/device.sh OUT sdpa       PyTorch's flash, cuDNN and memory-efficient attention at the Wan 14B
#                                    and H3 10 s shapes, token- and head-major, whole and in query slabs
#                                    (scripts/bench_sdpa.py; SDPA_ARGS: its arguments)
#   scripts/device.sh OUT gpu-tests  the test binaries built here, then the GPU tests (GTEST_FILTER,
#                                    default every Gpu* test)
# BENCH_ARGS adds options to `streamplan bench` (e.g. "--budget-floor 1.1"); CASES overrides
# the mode's bench or sweep cases; AB_CASES (mode all) are benched once more with the ATen
# row operations instead of the fused kernels.
#
# Header-only dependencies and GoogleTest's sources are taken from .deps/ when the machine
# has no packages for them (scripts/device-deps.sh fills it on a Debian machine).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/device.sh OUT [models]}"
mode="${2:-all}"
mkdir -p "$out"
py=${PYTHON:-python3}
bin=${STREAMPLAN_BIN:-build-gpu/streamplan}
summary=()

# The binary alone, where a mode needs it and no earlier call on this machine built it.
build_bin() {
  [ -x "$bin" ] && return 0
  prefix=$($py -c 'import torch; print(torch.utils.cmake_prefix_path)')
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
  { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTREAMPLAN_TESTS=OFF \
      -DCMAKE_INCLUDE_PATH="$PWD/.deps/include" -DCMAKE_PREFIX_PATH="$prefix;$PWD/.deps" &&
    cmake --build build-gpu --parallel "$(nproc)" --target streamplan; } >"$out/logs.txt" 2>&1 \
    || { tail -30 "$out/logs.txt"; exit 1; }
}

if [ "$mode" = policy ]; then
  build_bin
  cases=${CASES:-minimax-h3-block-5s,minimax-h3-block-10s,wan14b-block-81f,flux-dev-1024,flux-dev-2048}
  # One process per case set: the policies' plans run in turn on the same weights.
  $bin bench --device cuda --cases "$cases" --policies --budget-floor 1.1 ${BENCH_ARGS:-} --out "$out/policy.json" \
    2>>"$out/logs.txt" | tee "$out/policy.txt" || summary+=("bench --policies failed: $(tail -2 "$out/logs.txt" | tr '\n' ' ')")
  printf '%s\n' "${summary[@]}"
  exit 0
fi

if [ "$mode" = attention ]; then
  build_bin
  $bin bench-attention --device cuda ${BENCH_ARGS:-} --out "$out/attention.json" 2>>"$out/logs.txt" >"$out/attention.txt" \
    || summary+=("bench-attention failed: $(tail -2 "$out/logs.txt" | tr '\n' ' ')")
  grep -hE "budget" "$out/logs.txt" | tail -8
  printf '%s\n' "${summary[@]}"
  exit 0
fi

if [ "$mode" = residency ]; then
  build_bin
  for spec in ${RESIDENCY_CASES:-wan14b-model-81f:8GiB minimax-h3-model-10s:12GiB flux-dev-1024:10GiB,16GiB,24GiB}; do
    c=${spec%%:*}
    $bin bench --device cuda --cases "$c" --device-memory "${spec#*:}" --reps 2 ${BENCH_ARGS:-} --out "$out/residency-$c.json" \
      2>>"$out/logs.txt" | tee -a "$out/residency.txt" || summary+=("$c failed: $(tail -2 "$out/logs.txt" | tr '\n' ' ')")
  done
  printf '%s\n' "${summary[@]}"
  exit 0
fi

if [ "$mode" = formats ]; then
  build_bin
  cases=${CASES:-wan14b-block-81f,minimax-h3-block-10s}
  for f in ${FORMATS:-dense fp8-e4m3 convrot-int8 int8}; do
    fmt=(); [ "$f" = dense ] || fmt=(--format "$f")
    $bin bench --device cuda --cases "$cases" "${fmt[@]}" --profile-steps --quiet ${BENCH_ARGS:-} --out "$out/format-$f.json" \
      2>>"$out/logs.txt" | tee -a "$out/formats.txt" || summary+=("$f failed: $(tail -2 "$out/logs.txt" | tr '\n' ' ')")
  done
  [ "${LORA:-1}" = 0 ] || for extra in "" "--budget-floor 1.1"; do
    $bin bench --device cuda --cases wan14b-block-81f --lora-rank 64 --reps 5 --quiet $extra ${BENCH_ARGS:-} \
      --out "$out/lora64${extra:+-floor}.json" 2>>"$out/logs.txt" | tee -a "$out/formats.txt" || summary+=("lora failed")
  done
  printf '%s\n' "${summary[@]}"
  exit 0
fi

if [ "$mode" = consumers ]; then
  build_bin
  cases=${CASES:-minimax-h3-block-10s,wan14b-block-81f}
  for c in int8 sparse; do
    extra=(); [ "$c" = sparse ] && extra=(--kv-budget 0.3)
    $bin bench --device cuda --cases "$cases" --consumer "$c" "${extra[@]}" --reps 2 --quiet ${BENCH_ARGS:-} \
      --out "$out/consumer-$c.json" 2>>"$out/logs.txt" | tee -a "$out/consumers.txt" || summary+=("$c failed")
  done
  printf '%s\n' "${summary[@]}"
  exit 0
fi

if [ "$mode" = stack ]; then
  # fp8 projections with 8-bit attention against the bf16 dense plan (same process, same weights):
  # the blocks with int8 attention, the whole MiniMax H3 model with sparse attention at 0.3.
  build_bin
  for spec in ${STACK_CASES:-wan14b-block-81f,minimax-h3-block-10s:int8 minimax-h3-model-10s:sparse}; do
    c=${spec%%:*} consumer=${spec#*:}
    extra=(); [ "$consumer" = sparse ] && extra=(--kv-budget 0.3)
    $bin bench --device cuda --cases "$c" --format fp8-e4m3 --consumer "$consumer" "${extra[@]}" --reps 2 --quiet \
      ${BENCH_ARGS:-} --out "$out/stack-${consumer}-${c%%,*}.json" 2>>"$out/logs.txt" | tee -a "$out/stack.txt" \
      || summary+=("$spec failed: $(tail -2 "$out/logs.txt" | tr '\n' ' ')")
  done
  printf '%s\n' "${summary[@]}"
  exit 0
fi

if [ "$mode" = sdpa ]; then
  $py scripts/bench_sdpa.py --out "$out/sdpa.json" ${SDPA_ARGS:-} 2>>"$out/logs.txt" | tee "$out/sdpa.txt" \
    || summary+=("bench_sdpa failed: $(tail -2 "$out/logs.txt" | tr '\n' ' ')")
  printf '%s\n' "${summary[@]}"
  exit 0
fi

if [ "$mode" = gpu-tests ]; then
  prefix=$($py -c 'import torch; print(torch.utils.cmake_prefix_path)')
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
  gtest=(-DSTREAMPLAN_GTEST_SRC=)  # GoogleTest from the system, or from .deps/ where the machine has no package
  [ -d .deps/googletest ] && gtest=(-DSTREAMPLAN_GTEST_SRC="$PWD/.deps/googletest")
  { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTREAMPLAN_TESTS=ON \
      "${gtest[@]}" -DCMAKE_INCLUDE_PATH="$PWD/.deps/include" \
      -DCMAKE_PREFIX_PATH="$prefix;$PWD/.deps" &&
    cmake --build build-gpu --parallel "$(nproc)" --target streamplan exec_test lora_test attention_test; } >>"$out/logs.txt" 2>&1 \
    || { tail -30 "$out/logs.txt"; exit 1; }
  for t in exec_test lora_test attention_test; do
    build-gpu/tests/$t --gtest_filter="${GTEST_FILTER:-Gpu*}" 2>&1 | grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|rel_l2|Failure|error" \
      | tee -a "$out/gpu_tests.txt"
  done
  exit 0
fi

# The Python package built on this machine (its own build folder, target /tmp/streamplan-pkg),
# with wheels of what the machine lacks (diffusers, ...) from .whl/ where present.
build_package() {
  if ls .whl/*.whl >/dev/null 2>&1; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/streamplan-site .whl/*.whl \
      >>"$out/logs.txt" 2>&1 || { tail -20 "$out/logs.txt"; exit 1; }
    export PYTHONPATH=/tmp/streamplan-site${PYTHONPATH:+:$PYTHONPATH}
  else  # the build tools pinned in pyproject.toml then come from the machine, which may lack them
    echo "device.sh: no wheels in .whl/ (scripts/device-deps.sh fills it; carry it to this machine):" \
      "building with this machine's own scikit-build-core and pybind11" | tee -a "$out/logs.txt" >&2
  fi
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
  # An extension module must share the process's libstdc++: where the compiler in CXX has only
  # a static one (it would give the module a second copy, whose streams crash), the system's.
  if [ "$(${CXX:-g++} -print-file-name=libstdc++.so)" = libstdc++.so ] && [ -x /usr/bin/g++ ]; then
    export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
  fi
  defines=(-C cmake.define.CMAKE_INCLUDE_PATH="$PWD/.deps/include")
  # A carried pybind11 (the version torch's headers are) before the machine's own.
  [ -d /tmp/streamplan-site/pybind11 ] && defines+=(-C cmake.define.pybind11_DIR=/tmp/streamplan-site/pybind11/share/cmake/pybind11)
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) $py -m pip install -q --no-build-isolation --no-deps --upgrade \
    --target /tmp/streamplan-pkg -C build-dir=build-py-device -C cmake.define.STREAMPLAN_CLI=ON "${defines[@]}" . \
    >>"$out/logs.txt" 2>&1 \
    || { tail -30 "$out/logs.txt"; exit 1; }
  export PYTHONPATH=/tmp/streamplan-pkg:${PYTHONPATH:-}
}

if [ "$mode" = package ]; then
  # diffusers' WanPipeline with and without streamplan.apply (scripts/bench_package.py), then
  # the peers of the Wan and Flux bench cases (scripts/bench_peers.py; PEER_CASES picks them).
  build_package
  $py scripts/bench_package.py ${BENCH_ARGS:-} --out "$out/package.json" 2>>"$out/logs.txt" \
    || { tail -20 "$out/logs.txt"; exit 1; }
  $py scripts/bench_peers.py ${PEER_CASES:+--cases "$PEER_CASES"} --out "$out/peers.json" 2>>"$out/logs.txt" \
    || { tail -20 "$out/logs.txt"; exit 1; }
  exit 0
fi

if [ "$mode" = package-residency ]; then
  build_package
  $py scripts/bench_package_residency.py ${BENCH_ARGS:-} --out "$out/package_residency.json" 2>>"$out/logs.txt" \
    || { tail -20 "$out/logs.txt"; exit 1; }
  exit 0
fi

if [ "$mode" = soak ]; then
  build_package
  $py scripts/soak_package.py ${BENCH_ARGS:-} --out "$out/soak.json" 2>>"$out/logs.txt" | tee "$out/soak.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { tail -20 "$out/logs.txt"; exit 1; }
  exit 0
fi

if [ "$mode" = minimax ]; then
  # ComfyUI's MiniMaxH3Model with and without streamplan.apply (scripts/bench_minimax.py): a
  # ComfyUI tree in .deps/comfyui and comfy_kitchen for this machine's Python in .deps/ck312.
  build_package
  COMFY_KITCHEN_PATH=${COMFY_KITCHEN_PATH:-$PWD/.deps/ck312} $py scripts/bench_minimax.py ${BENCH_ARGS:-} \
    --out "$out/minimax.json" 2>>"$out/logs.txt" || { tail -20 "$out/logs.txt"; exit 1; }
  exit 0
fi

# Wheels of what ComfyUI imports that this machine lacks, from .whl-comfy/ (scripts/device-deps.sh),
# each installed into $site only where its import fails.
site=/tmp/streamplan-comfy-site
comfy_wheels() {
  mkdir -p "$site"
  for w in .whl-comfy/*.whl; do
    [ -e "$w" ] || continue
    mod=$(basename "$w" | cut -d- -f1)
    $py -c "import $mod" 2>/dev/null && continue
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$w" >>"$out/logs.txt" 2>&1
  done
}

if [ "$mode" = comfy-load ]; then
  # A ComfyUI master tree in .deps/comfyui-src (or COMFYUI_PATH) and comfy_kitchen in .deps/ck312.
  build_bin
  comfy_wheels
  PYTHONPATH=$PWD/.deps/ck312${PYTHONPATH:+:$PYTHONPATH} COMFY_SITE=$site \
    COMFYUI_PATH=${COMFYUI_PATH:-$PWD/.deps/comfyui-src} $py scripts/comfy_load_check.py --device cuda \
    --streamplan "$bin" --out "$out/comfy_load.json" 2>>"$out/logs.txt" | tee "$out/comfy_load.txt"
  exit "${PIPESTATUS[0]}"
fi

if [ "$mode" = comfy-check ]; then
  # ComfyUI's own sampling with and without the node (scripts/comfy_check.py): a ComfyUI tree
  # in .deps/comfyui-full (or COMFYUI_PATH), comfy_kitchen (its QuantizedTensor layouts) in
  # .deps/ck312. COMFY_FORMATS (e.g. "fp8,scaled-fp8,plain-e4m3,int8") runs the models from
  # checkpoints in those formats, written by the streamplan command the package's build holds.
  build_package
  comfy_wheels
  # the command in the package's build folder (configured with it; the package builds _C only)
  [ -z "${COMFY_FORMATS:-}" ] || cmake --build build-py-device --parallel "$(nproc)" --target streamplan \
    >>"$out/logs.txt" 2>&1 || { tail -30 "$out/logs.txt"; exit 1; }
  PYTHONPATH=$PWD/.deps/ck312${PYTHONPATH:+:$PYTHONPATH} COMFY_SITE=$site \
    COMFYUI_PATH=${COMFYUI_PATH:-$PWD/.deps/comfyui-full} $py scripts/comfy_check.py ${BENCH_ARGS:-} \
    ${COMFY_FORMATS:+--formats "$COMFY_FORMATS" --cli build-py-device/streamplan --work /tmp/comfy-check} \
    --out "$out/comfy_check.json" 2>>"$out/logs.txt" | tee "$out/comfy_check.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { tail -30 "$out/logs.txt"; exit 1; }
  exit 0
fi

if [ "$mode" = vram-check ]; then
  # scripts/comfy_vram_check.py with the package and the command of its build folder.
  build_package
  comfy_wheels
  cmake --build build-py-device --parallel "$(nproc)" --target streamplan >>"$out/logs.txt" 2>&1 ||
    { tail -30 "$out/logs.txt"; exit 1; }
  PYTHONPATH=$PWD/.deps/ck312${PYTHONPATH:+:$PYTHONPATH} COMFY_SITE=$site \
    COMFYUI_PATH=${COMFYUI_PATH:-$PWD/.deps/comfyui-full} $py scripts/comfy_vram_check.py ${VRAM_ARGS:---model wan} \
    --cli build-py-device/streamplan --work /tmp/vram-check --out "$out/vram_check.json" 2>>"$out/logs.txt" |
    tee "$out/vram_check.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { tail -30 "$out/logs.txt"; exit 1; }
  exit 0
fi

if [ "$mode" = sp-check ]; then
  build_package
  comfy_wheels
  PYTHONPATH=$PWD/.deps/ck312${PYTHONPATH:+:$PYTHONPATH} COMFY_SITE=$site \
    COMFYUI_PATH=${COMFYUI_PATH:-$PWD/.deps/comfyui-full} $py scripts/sp_check.py ${SP_ARGS:-} \
    --out "$out/sp_check.json" 2>>"$out/logs.txt" | tee "$out/sp_check.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { tail -30 "$out/logs.txt"; exit 1; }
  exit 0
fi

if [ "$mode" = all ] || [ "$mode" = test ]; then
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
  } >"$out/logs.txt" 2>&1 || { tail -50 "$out/logs.txt"; exit 1; }
  cp "$bin" "$out/streamplan"

  OMP_NUM_THREADS=4 ctest --test-dir build-gpu --output-on-failure --parallel 4 --timeout 900 >"$out/ctest.log" 2>&1 \
    && summary+=("test suite: passed") || summary+=("test suite: FAILED")
  grep -E "tests passed|tests failed|\*\*\*Failed|naive err" "$out/ctest.log" | tail -12
  if [ "$mode" = test ]; then
    build-gpu/tests/exec_test --gtest_filter='Gpu.*' 2>&1 | grep -E "err|OK \]|FAILED" | tee "$out/gpu_tests.txt"
    $bin plan --device cuda --tokens 16384 --dtype bf16 | head -3
    printf '%s\n' "${summary[@]}"
    exit 0
  fi

  # The demo at 16,384 tokens (fp32 and bf16).
  ck=/tmp/streamplan-ck && mkdir -p "$ck"
  $bin demo --device cuda --tokens 16384 --json >"$ck/demo_16384_fp32.json" 2>>"$out/logs.txt" || summary+=("demo fp32 failed")
  $bin demo --device cuda --tokens 16384 --dtype bf16 --json >"$ck/demo_16384_bf16.json" 2>>"$out/logs.txt" || summary+=("demo bf16 failed")

  # Two-layer real-dimension checkpoints of each family, written and run on the GPU.
  runs=("wan2.1-14b|diffusers|--frames 81 --height 720 --width 1280"
        "flux1-dev|diffusers|--height 2048 --width 2048"
        "minimax-h3|original|--frames 72 --height 768 --width 1376")
  for r in "${runs[@]}"; do
    IFS='|' read -r fam layout geom <<<"$r"
    { $bin make-checkpoint --family "$fam" --layers 2 --layout "$layout" --out "$ck/$fam.safetensors" &&
      $bin run --checkpoint "$ck/$fam.safetensors" --device cuda --dtype bf16 $geom --json \
        >"$ck/$fam.json" && rm -f "$ck/$fam.safetensors"; } >>"$out/logs.txt" 2>&1 || summary+=("run $fam failed")
  done
  $py - "$ck" "$out/runs.json" <<'PY'
import json, sys, os, glob
d, dst = sys.argv[1], sys.argv[2]
runs = {}
for f in sorted(glob.glob(os.path.join(d, "*.json"))):
    r = json.load(open(f)); plan = r.pop("plan", None); runs[os.path.basename(f)[:-5]] = r
    if plan and f.endswith("demo_16384_fp32.json"): r["plan_block0"] = plan["blocks"][0]
json.dump(runs, open(dst, "w"), indent=1)
PY

  # Budget sweeps (planned only) against fixed chunk sizes found by brute force.
  $bin bench --device cuda --cases minimax-h3-block-10s,wan14b-block-81f,flux-dev-1024 --sweep ${SWEEP_POINTS:-8} --reps 2 \
    --out "$out/sweep.json" >/tmp/streamplan-sweep.txt 2>>"$out/logs.txt" || summary+=("sweep failed")
  cases=${CASES:-minimax-h3-block-5s,minimax-h3-block-10s,wan14b-block-81f,flux-dev-1024,flux-dev-2048}
  # The same schedules with the ATen row operations: what the fused kernels are worth.
  $bin bench --device cuda --cases "${AB_CASES:-wan14b-block-81f,flux-dev-2048}" ${BENCH_ARGS:-} --row-kernels aten \
    --out "$out/bench_aten.json" >/tmp/streamplan-bench-aten.txt 2>>"$out/logs.txt" || summary+=("bench aten failed")
elif [ "$mode" = sweep-models ]; then
  build_bin
  $bin bench --device cuda --cases "${CASES:-minimax-h3-model-10s,wan14b-model-81f}" --sweep ${SWEEP_POINTS:-3} \
    --sweep-min-floor 1.1 --reps 1 --fixed-chunks 4096,16384 --out "$out/sweep_models.json" \
    >/tmp/streamplan-sweep.txt 2>>"$out/logs.txt" || summary+=("sweep failed")
  printf '%s\n' "${summary[@]}"
  cat /tmp/streamplan-sweep.txt
  exit 0
else
  build_bin
  cases=${CASES:-minimax-h3-model-5s,minimax-h3-model-10s,wan14b-model-81f}
fi

bench_txt=/tmp/streamplan-bench-$mode.txt
$bin bench --device cuda --cases "$cases" ${BENCH_ARGS:-} --out "$out/bench_$mode.json" >"$bench_txt" 2>>"$out/logs.txt" \
  || summary+=("bench $mode failed: $(tail -2 "$out/logs.txt" | tr '\n' ' ')")
$py scripts/bench_chart.py "$out/bench_$mode.json" "$out/bench_$mode.png" 2>/dev/null || true

$py - "$out" "$mode" <<'PY'
import json, sys, os
out, mode = sys.argv[1], sys.argv[2]
M = 1 << 20
if mode == "all":
    print(f"\n{'run':22} {'tokens':>7} {'naive MiB':>10} {'planned MiB':>12} {'floor MiB':>10} {'est/meas':>9} {'p/n time':>9} {'rel_l2':>9}")
    rows = []
    try: rows += list(json.load(open(os.path.join(out, "runs.json"))).items())
    except Exception as e: print(f"runs failed: {e}")
    for n, r in rows:
        nv, pl = r["naive"], r["planned"]
        nm = f"{nv['peak_bytes']/M:10.1f}" if nv["peak_bytes"] is not None else f"{'n/a':>10}"
        tr = f"{pl['ms']/nv['ms']:9.3f}" if nv["ms"] else f"{'n/a':>9}"
        print(f"{n:22} {r['tokens']:>7} {nm} {pl['peak_bytes']/M:12.1f} {r['floor_bytes']/M:10.1f} "
              f"{pl['estimated_peak_bytes']/pl['peak_bytes']:9.4f} {tr} {r['error']['rel_l2'] or 0:9.2e}")
print()
try: print(open(f"/tmp/streamplan-bench-{mode}.txt").read())
except Exception as e: print("bench:", e)
if mode == "all":
    try: print("ATen row operations instead of the fused kernels:\n" + open("/tmp/streamplan-bench-aten.txt").read())
    except Exception as e: print("bench aten:", e)
    try: print(open("/tmp/streamplan-sweep.txt").read())
    except Exception as e: print("sweep:", e)
PY
printf '%s\n' "${summary[@]}"
