#!/usr/bin/env bash
# The main job on a CPU machine: build, then a short 4-rank (dp 2 x sp 2) training run of
# ulysses-train launched by ulysses-tune. Writes runs/tiny-cpu/{metrics.jsonl,summary.json}.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/build.sh ulysses_train ulysses_tune
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
build/bin/ulysses-tune launch experiments/runs/tiny-cpu.yaml --nproc 4 "$@"
echo "metrics: runs/tiny-cpu/metrics.jsonl  summary: runs/tiny-cpu/summary.json"
