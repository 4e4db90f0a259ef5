#!/usr/bin/env bash
# Builds everything and runs the whole test suite with ctest (what CI runs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/build.sh
cd build
ctest --output-on-failure -j"${JOBS:-$(nproc)}" --timeout 600
