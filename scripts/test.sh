#!/usr/bin/env bash
# Builds everything and runs the whole test suite with ctest (what CI runs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/build.sh
cd build
# Tests labelled `slow` (a fresh build of DeepSpeed's ops for the backend's first-run test, about
# 7-14 minutes on 2 cores) run with `ctest -L slow`, not here.
ctest --output-on-failure -j"${JOBS:-$(nproc)}" --timeout 600 -LE slow
