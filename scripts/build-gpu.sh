#!/usr/bin/env bash
# Configures and builds ulysses-train, ulysses-tune and ulysses-bench against the PyTorch that a
# Python already has (on a GPU node: its CUDA build, with NCCL), installing nothing and needing no
# root. Prints `ulysses-train --version` at the end (a CUDA build: "nccl yes, cuda yes").
#
# Usage: scripts/build-gpu.sh [--python PY] [--deps PREFIX] [--tests] [--target T]...
#                             [--no-fused-kernels] [--print] [BUILD_DIR]
#   BUILD_DIR      build directory (default: build); one configured against another PyTorch is
#                  refused (pass another directory)
#   --python PY    the Python whose torch to build against (default: $PYTHON, else python3)
#   --deps PREFIX  where the libraries are when not installed system-wide: a prefix with
#                  include/ and lib/, or one unpacked by scripts/fetch-deps.sh (PREFIX/usr)
#   --tests        also build the test suites (needs GoogleTest)
#   --target T     build only these targets (repeatable; default: the three programs, or
#                  everything with --tests), e.g. `--tests --target ulysses_train --target
#                  model_unit_tests` for the programs and one test suite in one ninja run
#   --no-fused-kernels  build without the fused CUDA kernels (src/kernels/; the model keeps its
#                  ATen ops and refuses model.fused_kernels), also where nvcc is found
#   --print        print the cmake commands and run nothing
# Environment: JOBS (default: the number of cores), CUDA_HOME (the CUDA toolkit; default: the
# nvcc on PATH, else /usr/local/cuda), TORCH_CUDA_ARCH_LIST (default: the GPU's, else 9.0).
# Exit status: 0 built, 1 a build step failed, 2 a missing prerequisite (one line says which).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
deps="" tests=OFF print=0 build="" targets=() fused_kernels=ON
while [ $# -gt 0 ]; do
  case $1 in
    --python) python=${2:?--python PY}; shift 2 ;;
    --deps) deps=${2:?--deps PREFIX}; shift 2 ;;
    --tests) tests=ON; shift ;;
    --target) targets+=("${2:?--target T}"); shift 2 ;;
    --no-fused-kernels) fused_kernels=OFF; shift ;;
    --print) print=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "build-gpu: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) build=$1; shift ;;
  esac
done
build=${build:-build}
case $build in /*) ;; *) build=$PWD/$build ;; esac
die() { echo "build-gpu: $*" >&2; exit 2; }

# 1. The PyTorch to build against: version, CMake prefix, CUDA version, its NCCL headers.
info=$("$python" - 2> /dev/null << 'EOF'
import os, torch
nvidia = os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia")
nccl = os.path.join(nvidia, "nccl", "include")
print(torch.__version__.split("+")[0], torch.utils.cmake_prefix_path, torch.version.cuda,
      torch.distributed.is_nccl_available() if torch.distributed.is_available() else False,
      nccl if os.path.isfile(os.path.join(nccl, "nccl.h")) else "-")
EOF
) || die "$python cannot import torch (pass --python with the Python that has PyTorch >= 2.3)"
read -r torch_version torch_prefix torch_cuda torch_nccl wheel_nccl <<< "$info"
IFS=. read -r major minor _ <<< "$torch_version"
if [ "$major" -lt 2 ] || { [ "$major" -eq 2 ] && [ "$minor" -lt 3 ]; }; then
  die "PyTorch $torch_version in $python: needs >= 2.3"
fi

# 2. The libraries (yaml-cpp, SQLite, CLI11, nlohmann-json, Google Benchmark, Gloo's headers).
prefixes=$torch_prefix
if [ -n "$deps" ]; then
  deps=$(cd "$deps" 2> /dev/null && pwd) || die "--deps: no directory $deps"
  [ -d "$deps/usr" ] && prefixes+=";$deps/usr"
  prefixes+=";$deps"
fi
args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefixes"
      -DULYSSES_PYTHON="$(command -v "$python")" -DULYSSES_BUILD_TESTS=$tests
      -DULYSSES_ENABLE_FUSED_KERNELS=$fused_kernels)
command -v ninja > /dev/null && args+=(-G Ninja)

# 3. CUDA: the toolkit (nvcc, headers) that LibTorch's CMake files need, and NCCL's header.
cxx_flags=""
if [ "$torch_cuda" != None ]; then
  nvcc=""
  if [ -n "${CUDA_HOME:-}" ]; then nvcc=$CUDA_HOME/bin/nvcc
  elif command -v nvcc > /dev/null; then nvcc=$(command -v nvcc)
  else nvcc=/usr/local/cuda/bin/nvcc; fi
  [ -x "$nvcc" ] || die "PyTorch $torch_version is a CUDA $torch_cuda build: needs the CUDA toolkit" \
    "(nvcc and headers, CUDA $torch_cuda or a compatible release): set CUDA_HOME or put nvcc on PATH"
  cuda_home=$(cd "$(dirname "$nvcc")/.." && pwd)
  args+=(-DCMAKE_CUDA_COMPILER="$nvcc" -DCUDAToolkit_ROOT="$cuda_home")
  arch=${TORCH_CUDA_ARCH_LIST:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader \
                                   2> /dev/null | head -n1 || true)}
  args+=(-DTORCH_CUDA_ARCH_LIST="${arch:-9.0}")
  # ProcessGroupNCCL.hpp includes nccl.h: from the toolkit, the system, or torch's NCCL wheel.
  if [ "$torch_nccl" = True ] && [ ! -f "$cuda_home/include/nccl.h" ] &&
     [ ! -f /usr/include/nccl.h ] && [ "$wheel_nccl" != - ]; then
    cxx_flags+=" -isystem $wheel_nccl"
  fi
fi
[ -n "$cxx_flags" ] && args+=(-DCMAKE_CXX_FLAGS="$cxx_flags")

if [ ${#targets[@]} -eq 0 ]; then
  targets=(ulysses_train ulysses_tune ulysses_bench)
  [ "$tests" = ON ] && targets=(all)
fi
build_cmd=(cmake --build "$build" -j"${JOBS:-$(nproc)}" --target "${targets[@]}")
if [ "$print" = 1 ]; then
  echo "# PyTorch $torch_version (CUDA $torch_cuda, NCCL $torch_nccl) from $python"
  echo "cmake$(printf ' %q' "${args[@]}")"
  echo "$(printf '%q ' "${build_cmd[@]}")"
  exit 0
fi

# 4. A build directory made for another PyTorch is not reconfigured (it may be someone's).
cache=$build/CMakeCache.txt
if [ -f "$cache" ]; then
  configured=$(sed -n 's/^Torch_DIR:PATH=//p' "$cache")
  if [ -n "$configured" ] && [ "$configured" != "$torch_prefix/Torch" ]; then
    die "$build is configured against another PyTorch ($configured); pass another BUILD_DIR"
  fi
fi
mkdir -p "$build"
log=$build/configure.log
echo "+ cmake$(printf ' %q' "${args[@]}")"
cmake "${args[@]}" > "$log" 2>&1 || {
  tail -n 25 "$log" >&2
  echo "build-gpu: configure failed (log: $log); for a missing library see README.md," \
    "\"GPU nodes and clusters\"" >&2
  exit 1
}
grep "ulysses: Torch" "$log" || true
echo "+ $(printf '%q ' "${build_cmd[@]}")"
"${build_cmd[@]}" || exit 1
"$build/bin/ulysses-train" --version
