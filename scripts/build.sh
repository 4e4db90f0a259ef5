#!/usr/bin/env bash
# Configures and builds the project into build/ (Release, Ninja). Usage: scripts/build.sh [targets]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh
jobs=${JOBS:-$(nproc)}
[ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs" ${1:+--target "$@"}
