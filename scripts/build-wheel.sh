#!/usr/bin/env bash
# Builds a wheel of the Python package streamplan for one Python and the torch installed in it
# (the project's .venv, with the torch that requirements.txt pins, unless --python or PYTHON
# names another: ComfyUI's, for example), and says which torch and CUDA it matches and where it is.
#
#   scripts/build-wheel.sh [--python PY] [--out DIR] [--build-dir DIR] [--cpu] [--archs LIST] [--jobs N] [--check]
#
#   --python PY      the Python to build for (default: $PYTHON, else .venv/bin/python)
#   --out DIR        where the wheel goes (default: dist/)
#   --build-dir DIR  CMake's build folder (default: build-wheel/; kept, so a second run is quick)
#   --cpu            no CUDA kernels (a CPU build; also what a torch without CUDA gets)
#   --archs LIST     the kernels' CUDA architectures, e.g. "90" or "80;90" (default: 90)
#   --jobs N         parallel compile jobs (default: the number of cores)
#   --check          only check the prerequisites, build nothing
#
# The extension module links that torch's libtorch and goes through its pybind11 casters, so the
# wheel runs with exactly that torch version (install it with --no-deps into a Python that has it).
# Prerequisites, each checked first with a one-line error naming what is missing and how to get it:
# Python >= 3.10 with torch, pip, scikit-build-core 1.1.2 and the pybind11 whose headers that torch
# ships (3.0.1 for torch 2.11); CMake >= 3.24; a C++20 compiler with a shared libstdc++; the headers
# of nlohmann-json and CLI11; for the CUDA kernels nvcc of torch's CUDA major version (CUDACXX, PATH
# or /usr/local/cuda/bin); for the fused 8-bit GEMM on sm_90a the nvidia-cutlass wheel (optional).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
out=$root/dist
build_dir=$root/build-wheel
cpu=0
archs=""
jobs=$(nproc 2>/dev/null || echo 2)
check_only=0

fail() { echo "build-wheel: error: $*" >&2; exit 1; }
need_value() { [ $# -ge 2 ] && [ -n "$2" ] && [[ $2 != --* ]] || fail "$1: needs a value"; }
while [ $# -gt 0 ]; do
  case $1 in
    --python) need_value "$@"; py=$2; shift 2 ;;
    --out) need_value "$@"; out=$2; shift 2 ;;
    --build-dir) need_value "$@"; build_dir=$2; shift 2 ;;
    --cpu) cpu=1; shift ;;
    --archs) need_value "$@"; archs=$2; shift 2 ;;
    --jobs) need_value "$@"; jobs=$2; shift 2 ;;
    --check) check_only=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) fail "unknown argument '$1' (see --help)" ;;
  esac
done
[[ $jobs =~ ^[1-9][0-9]*$ ]] || fail "--jobs: expected a count >= 1, got '$jobs'"
[ -z "$archs" ] || [[ $archs =~ ^[0-9]+a?(\;[0-9]+a?)*$ ]] || fail "--archs: expected architectures such as 90 or '80;90', got '$archs'"
[ "$cpu" = 0 ] || [ -z "$archs" ] || fail "--archs: goes with a CUDA build, not with --cpu"

# --- Python, torch and the build tools in that Python ------------------------------------------
command -v "$py" >/dev/null 2>&1 || fail "--python $py: no such Python (give --python PY or PYTHON=PY; scripts/setup.sh makes .venv)"
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null ||
  fail "$py is Python $("$py" -c 'import platform; print(platform.python_version())' 2>/dev/null || echo '?'); streamplan needs >= 3.10"
torch_info=$("$py" -c 'import torch, os; print(torch.__version__, torch.version.cuda or "none", os.path.dirname(torch.__file__))' 2>/dev/null) ||
  fail "$py cannot import torch; install torch into it first (the project pins $(grep -m1 '^torch==' "$root/requirements.txt"))"
read -r torch_version torch_cuda torch_dir <<<"$torch_info"
pinned_torch=$(sed -n 's/^torch==//p' "$root/requirements.txt" | head -1)
"$py" -m pip --version >/dev/null 2>&1 || fail "$py has no pip (python -m ensurepip, or the distribution's python3-pip)"
pin() { sed -n "s/.*\"$1==\([^\"]*\)\".*/\1/p" "$root/pyproject.toml" | head -1; }
installed() { "$py" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || echo none; }
skbuild_pin=$(pin scikit-build-core)
torch_pybind11=$(sed -nE 's/^#define PYBIND11_VERSION_(MAJOR|MINOR|MICRO) +([0-9]+).*/\2/p' \
                 "$torch_dir/include/pybind11/detail/common.h" 2>/dev/null | paste -sd.)
[ -n "$torch_pybind11" ] || fail "torch $torch_version at $torch_dir ships no pybind11 headers (include/pybind11); a torch wheel from PyPI has them"
[ "$(installed scikit-build-core)" = "$skbuild_pin" ] ||
  fail "$py has scikit-build-core $(installed scikit-build-core), the build needs $skbuild_pin: $py -m pip install scikit-build-core==$skbuild_pin"
[ "$(installed pybind11)" = "$torch_pybind11" ] ||
  fail "$py has pybind11 $(installed pybind11), torch $torch_version ships the headers of $torch_pybind11 and the extension must match them: $py -m pip install pybind11==$torch_pybind11"

# --- CMake, a C++20 compiler and the headers ---------------------------------------------------
cmake_bin=$(command -v cmake || true)
[ -n "$cmake_bin" ] || fail "no cmake on PATH; install CMake >= 3.24 (apt-get install cmake, or $py -m pip install cmake)"
cmake_version=$("$cmake_bin" --version | sed -n 's/^cmake version \([0-9.]*\).*/\1/p')
[ "$(printf '%s\n3.24\n' "$cmake_version" | sort -V | head -1)" = 3.24 ] ||
  fail "cmake $cmake_version at $cmake_bin is older than 3.24 ($py -m pip install cmake, or a newer distribution package)"
if [ -n "${CXX:-}" ]; then
  cxx=$(command -v "$CXX" || true)
  [ -n "$cxx" ] || fail "CXX=$CXX: no such compiler"
else
  cxx=$(command -v c++ || command -v g++ || command -v clang++ || true)
  [ -n "$cxx" ] || fail "no C++ compiler (CXX, c++, g++ or clang++); install one (apt-get install build-essential)"
fi
echo 'int main() { return 0; }' | "$cxx" -std=c++20 -x c++ - -o /dev/null 2>/dev/null ||
  fail "the C++ compiler $cxx does not compile C++20; give a newer one in CXX (GCC >= 11 or Clang >= 14)"
for header in "nlohmann/json.hpp nlohmann-json3-dev" "CLI/CLI.hpp libcli11-dev"; do
  read -r file package <<<"$header"
  echo "#include <$file>" | "$cxx" -std=c++20 -fsyntax-only -x c++ - 2>/dev/null ||
    fail "the C++ compiler $cxx finds no <$file>; install it (apt-get install $package) or put its folder in CPATH"
done

# --- CUDA ----------------------------------------------------------------------------------------
defines=()
if [ "$torch_cuda" = none ] && [ "$cpu" = 0 ]; then
  echo "build-wheel: torch $torch_version has no CUDA: a CPU build"
  cpu=1
fi
cutlass=""
if [ "$cpu" = 1 ]; then
  defines+=(-C cmake.define.STREAMPLAN_CUDA=OFF)
  kind="CPU (no CUDA kernels)"
else
  nvcc=${CUDACXX:-$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || true)}
  [ -n "$nvcc" ] && [ -x "$nvcc" ] ||
    fail "no nvcc (CUDACXX, PATH or /usr/local/cuda/bin): the CUDA kernels need the CUDA toolkit $torch_cuda of torch $torch_version; install it, or build without them: --cpu"
  nvcc_version=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
  [ "${nvcc_version%%.*}" = "${torch_cuda%%.*}" ] ||
    fail "nvcc $nvcc_version at $nvcc, but torch $torch_version is built with CUDA $torch_cuda: install the CUDA $torch_cuda toolkit (or give its nvcc in CUDACXX)"
  defines+=(-C cmake.define.CMAKE_CUDA_COMPILER="$nvcc")
  [ -z "$archs" ] || defines+=(-C "cmake.define.STREAMPLAN_CUDA_ARCHS=$archs")
  kind="CUDA (nvcc $nvcc_version at $nvcc; kernels for the architectures ${archs:-90}, and torch's)"
  if [ "$(installed nvidia-cutlass)" = none ]; then
    cutlass="without the fused 8-bit GEMM for sm_90a (no CUTLASS headers: $py -m pip install $(grep -m1 '^nvidia-cutlass==' "$root/requirements.txt"))"
  fi
fi

echo "build-wheel: for $py (Python $("$py" -c 'import platform; print(platform.python_version())')), torch $torch_version, CUDA $torch_cuda"
[ "$torch_version" = "$pinned_torch" ] || [ "${torch_version%%+*}" = "$pinned_torch" ] ||
  echo "build-wheel: note: torch $torch_version is not the one requirements.txt pins ($pinned_torch); the wheel is for $torch_version"
echo "build-wheel: build $kind; scikit-build-core $skbuild_pin, pybind11 $torch_pybind11, cmake $cmake_version, $cxx"
[ -z "$cutlass" ] || echo "build-wheel: note: $cutlass"
[ "$check_only" = 0 ] || { echo "build-wheel: prerequisites found (--check: nothing built)"; exit 0; }

# --- the wheel ------------------------------------------------------------------------------------
mkdir -p "$out" "$build_dir" 2>/dev/null || fail "--out $out / --build-dir $build_dir: cannot create them"
out=$(cd "$out" && pwd)
log=$build_dir/wheel.log
before=$(ls "$out"/streamplan-*.whl 2>/dev/null || true)
echo "build-wheel: building in $build_dir with $jobs jobs (log: $log); a first build takes minutes"
start=$(date +%s)
if ! CXX=$cxx CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$py" -m pip wheel -v --no-build-isolation --no-deps -w "$out" \
       -C build-dir="$build_dir" "${defines[@]}" "$root" >"$log" 2>&1; then
  grep -E 'error|Error|FATAL' "$log" | tail -15 >&2 || true
  fail "the build failed after $(( $(date +%s) - start )) s; the whole log is $log"
fi
wheel=$(ls -t "$out"/streamplan-*.whl 2>/dev/null | head -1 || true)
[ -n "$wheel" ] || fail "pip wheel succeeded but left no streamplan-*.whl in $out (log: $log)"
grep -o -- '-- streamplan: .*' "$log" | sed 's/^-- /build-wheel: configure: /' | sort -u || true
[ -n "$before" ] && echo "$before" | grep -qx "$wheel" && echo "build-wheel: note: $wheel was there before; pip rebuilt it"
echo "build-wheel: wheel $wheel ($(du -h "$wheel" | cut -f1), $(( $(date +%s) - start )) s)"
echo "build-wheel: it matches torch $torch_version (CUDA $torch_cuda) and Python $("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])') exactly"
echo "build-wheel: install it with: $py -m pip install --no-deps --force-reinstall $wheel && $py -m streamplan.check"
