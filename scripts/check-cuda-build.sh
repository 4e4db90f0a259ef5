#!/usr/bin/env bash
# Compile check of the CUDA-only code paths: builds every target against the CUDA build of
# PyTorch 2.14.1 into build-cuda/, on a machine without a GPU, and prints a one-line verdict.
#   - venv: <root>/.venv-cuda (ignored by git) holding torch==2.14.1 and the nvidia-* wheels it
#     depends on (cuBLAS/cuSPARSE/cuSOLVER, NCCL, cuDNN headers); installed only when missing;
#   - CUDA toolkit (nvcc, cudart, NVTX3 headers): $CUDA_HOME, default /usr/local/cuda-13.0.
# It proves that the code compiles and links with CUDA=ON and NCCL compiled in; nothing runs.
# Usage: scripts/check-cuda-build.sh [--targets "T1 T2 ..."]
#   --targets  build only these targets (e.g. "ulysses_kernels model_tests"), not every one
# Environment: CUDA_HOME, JOBS (default 2), ULYSSES_CUDA_VENV (default <root>/.venv-cuda).
# Exit status: 0 when every target built, 1 otherwise.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --targets) read -r -a targets <<< "${2:?--targets \"T1 T2 ...\"}"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "check-cuda-build: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
torch_version=2.14.1
cuda_home=${CUDA_HOME:-/usr/local/cuda-13.0}
jobs=${JOBS:-2}
venv=${ULYSSES_CUDA_VENV:-$root/.venv-cuda}
build=build-cuda
log=$build/cuda-build.log
start=$(date +%s)
verdict() {  # verdict PASS|FAIL "text"
  echo "check-cuda-build: $1: $2 ($(($(date +%s) - start)) s)"
  [ "$1" = PASS ]
}

# 1. The venv with the CUDA build of torch (pinned; from the local wheel cache, no download).
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
installed=$("$py" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
if [ "$installed" != "$torch_version" ]; then
  echo "installing torch==$torch_version (CUDA) into $venv"
  "$py" -m pip install -q --disable-pip-version-check "torch==$torch_version"
  installed=$("$py" -c 'import importlib.metadata as m; print(m.version("torch"))')
fi
# torch.utils.cmake_prefix_path, the CUDA version torch was built with, and the nvidia-* wheels
# root (importing torch needs no GPU; stderr holds only a harmless "no numpy" warning).
read -r torch_prefix torch_cuda nvidia < <("$py" -c 'import os, torch
print(torch.utils.cmake_prefix_path, torch.version.cuda,
      os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia"))' 2>/dev/null || true)
[ -d "$torch_prefix" ] || { verdict FAIL "no torch in $venv"; exit 1; }
[ "$torch_cuda" != None ] || { verdict FAIL "torch $installed in $venv is not a CUDA build"; exit 1; }
[ -x "$cuda_home/bin/nvcc" ] || { verdict FAIL "no nvcc at $cuda_home/bin/nvcc (set CUDA_HOME)"; exit 1; }

# 2. Configure. The toolkit here is nvcc + cudart + NVTX3 only: the library headers LibTorch's
# CUDA headers include (cuBLAS, cuSPARSE, cuSOLVER via ATen/cuda/CUDAContext.h; nccl.h via
# ProcessGroupNCCL.hpp) come from the nvidia-* wheels, as does libnvrtc (TorchConfig links it).
# They go last (-isystem after the toolkit's own include dir), so the toolkit's CUDA headers win.
# TORCH_CUDA_ARCH_LIST: there is no GPU to detect; 9.0 (Hopper) for the .cu files of src/kernels/.
extra_includes=""
for d in cu13/include nccl/include cudnn/include; do
  if [ -d "$nvidia/$d" ]; then extra_includes+=" -isystem $nvidia/$d"; fi
done
nvrtc=$(ls "$nvidia"/cu13/lib/libnvrtc.so.* 2>/dev/null | grep -v builtins | grep -v alt | head -n1 || true)
cmake_args=(-S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_PREFIX_PATH="$torch_prefix"
  -DCMAKE_CUDA_COMPILER="$cuda_home/bin/nvcc"
  -DCUDA_TOOLKIT_ROOT_DIR="$cuda_home" -DCUDAToolkit_ROOT="$cuda_home"
  -DTORCH_CUDA_ARCH_LIST=9.0
  -DCMAKE_CXX_FLAGS="$extra_includes"
  -DULYSSES_PYTHON="$py")
if [ -n "$nvrtc" ]; then cmake_args+=(-DCUDA_NVRTC_LIB="$nvrtc"); fi
mkdir -p "$build"
echo "+ cmake$(printf " %q" "${cmake_args[@]}")"
if ! cmake "${cmake_args[@]}" >"$build/configure.log" 2>&1; then
  tail -n 30 "$build/configure.log"
  verdict FAIL "configure failed, see $build/configure.log"
  exit 1
fi
grep -q "ulysses: Torch .*CUDA=ON" "$build/configure.log" ||
  { grep "ulysses: Torch" "$build/configure.log"; verdict FAIL "CMake did not report CUDA=ON"; exit 1; }
# NCCL: torch_cuda exports USE_C10D_NCCL, which is what src/comm/rendezvous.cpp tests.
torch_include=$(dirname "$(dirname "$torch_prefix")")/include
[ -f "$torch_include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp" ] &&
  grep -q -- "-DUSE_C10D_NCCL" "$build/compile_commands.json" ||
  { verdict FAIL "NCCL is not compiled in (no ProcessGroupNCCL.hpp or no -DUSE_C10D_NCCL)"; exit 1; }
grep "ulysses: Torch" "$build/configure.log"

# 3. Build every target, or those of --targets (-k 0: go on past errors, so one run shows all of
# them), at low priority: other builds share the cores.
target_args=()
[ ${#targets[@]} -gt 0 ] && target_args=(--target "${targets[@]}")
set +e
nice -n 19 cmake --build "$build" -j"$jobs" "${target_args[@]}" -- -k 0 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
failed=$(grep -c '^FAILED: ' "$log" || true)
if [ "$rc" -ne 0 ]; then
  verdict FAIL "$failed build steps failed (torch $installed, CUDA $torch_cuda), see $log"
  exit 1
fi
if [ ${#targets[@]} -gt 0 ]; then
  verdict PASS "${targets[*]} built with CUDA=ON (torch $installed, CUDA $torch_cuda)"
  exit 0
fi
# The NCCL path really got compiled: rendezvous.cpp's object refers to ProcessGroupNCCL.
obj=$(find "$build" -name 'rendezvous.cpp.o' | head -n1)
# (grep -c, not -q: -q would close the pipe early and fail it under pipefail)
[ "$(nm -C "$obj" | grep -c 'c10d::ProcessGroupNCCL::ProcessGroupNCCL')" -gt 0 ] ||
  { verdict FAIL "rendezvous.cpp.o does not refer to ProcessGroupNCCL"; exit 1; }
verdict PASS "every target built with CUDA=ON and NCCL (torch $installed, CUDA $torch_cuda)"
