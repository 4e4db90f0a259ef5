#!/usr/bin/env bash
# Configures and builds the project into build/ (Release, Ninja) against the LibTorch inside the
# venv's PyTorch (scripts/install-deps.sh). Usage: scripts/build.sh [targets]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh
venv=${ULYSSES_VENV:-$root/.venv}
jobs=${JOBS:-$(nproc)}
if [ ! -f build/build.ninja ]; then
  torch_prefix=$("$venv/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DULYSSES_PYTHON="$venv/bin/python"
fi
cmake --build build -j"$jobs" ${1:+--target "$@"}
