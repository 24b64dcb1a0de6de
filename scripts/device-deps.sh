#!/usr/bin/env bash
# Fills what a GPU machine without Debian's packages or PyPI needs (all of it ignored by git):
#   .deps/include, .deps/googletest  the nlohmann-json and CLI11 headers and GoogleTest's
#                                    sources, copied from this machine's packages
#   .whl/                            wheels the Python package and its benchmarks need there
#                                    (the pins of requirements.txt, for the machine's Python)
#   .deps/ck312/                     comfy-kitchen for that Python, without its ROCm backend
#                                    (scripts/bench_minimax.py; ComfyUI's H3 attention needs it)
#   .whl-comfy/                      wheels of what ComfyUI's sampling imports beyond torch
#                                    (scripts/comfy_check.py; installed there where missing)
#   .deps/cutlass-include.tar.gz     the CUTLASS headers (include/cutlass, include/cute) of the
#                                    nvidia-cutlass wheel pinned in requirements.txt, ~2.4 MB: CMake
#                                    unpacks them into the build folder where the machine's Python
#                                    has no such wheel (the fused int8 GEMM for sm_90a)
#   .deps/comfyui-src/               where .deps/comfyui-master holds a ComfyUI master checkout:
#                                    its Python sources and small JSON configs (no tokenizer
#                                    data, no .git; ~7 MB), what scripts/comfy_load_check.py imports
# Run scripts/setup.sh first. DEVICE_PYTHON is the GPU machine's Python version (default 3.12).
# ComfyUI's own tree (.deps/comfyui, for scripts/bench_minimax.py) is not on PyPI; its
# README.md says what it holds.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${DEVICE_PYTHON:-3.12}
pin() { grep -E "^$1==" requirements.txt; }

rm -rf .deps/include .deps/googletest && mkdir -p .deps/include
cp -r /usr/include/nlohmann /usr/include/CLI .deps/include/
cp -r /usr/src/googletest .deps/

rm -rf .deps/cutlass-include.tar.gz /tmp/streamplan-cutlass && mkdir -p /tmp/streamplan-cutlass
.venv/bin/pip download -q --no-deps --only-binary=:all: -d /tmp/streamplan-cutlass "$(pin nvidia-cutlass)"
.venv/bin/python - /tmp/streamplan-cutlass <<'PY'
import glob, os, sys, zipfile
d = sys.argv[1]
with zipfile.ZipFile(glob.glob(os.path.join(d, "nvidia_cutlass-*.whl"))[0]) as z:
    for n in z.namelist():
        if n.startswith("cutlass_library/source/include/"):
            z.extract(n, d)
PY
tar -czf .deps/cutlass-include.tar.gz -C /tmp/streamplan-cutlass/cutlass_library/source include

rm -rf .whl && mkdir -p .whl
.venv/bin/pip download -q --no-deps --only-binary=:all: --python-version "$py" -d .whl \
  "$(pin diffusers)" "$(pin pybind11)" "$(pin scikit-build-core)" "$(pin pathspec)" "$(pin importlib_metadata)"

rm -rf .deps/ck312 /tmp/streamplan-ck && mkdir -p .deps/ck312 /tmp/streamplan-ck
.venv/bin/pip download -q --no-deps --only-binary=:all: --python-version "$py" \
  --platform manylinux_2_28_x86_64 -d /tmp/streamplan-ck comfy-kitchen==0.2.40
.venv/bin/python -m zipfile -e /tmp/streamplan-ck/comfy_kitchen-*.whl .deps/ck312
rm -rf .deps/ck312/comfy_kitchen/backends/hip  # 150 MB of ROCm code the H200 does not load
rm -rf .whl-comfy && mkdir -p .whl-comfy
.venv/bin/pip download -q --no-deps --only-binary=:all: --python-version "$py" --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl-comfy \
  einops psutil torchsde trampoline scipy torchvision==0.26.0 torchaudio==2.11.0 comfy-aimdo==0.4.13
if [ -d .deps/comfyui-master/comfy ]; then
  rm -rf .deps/comfyui-src && mkdir -p .deps/comfyui-src
  (cd .deps/comfyui-master && find comfy comfy_api comfy_execution comfy_config utils -type f \
     \( -name "*.py" -o -name "*.json" -size -200k \) -exec cp --parents {} ../comfyui-src/ \; && cp ./*.py ../comfyui-src/)
fi
du -sh .deps/include .deps/googletest .deps/cutlass-include.tar.gz .whl .deps/ck312 .whl-comfy .deps/comfyui-src 2>/dev/null
