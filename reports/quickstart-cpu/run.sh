#!/usr/bin/env bash
# Makes reports/quickstart-cpu/: the quickstart sweep (smart search) and the exhaustive grid of
# the same space on the same machine, their recommendations, and the report of the smart sweep.
# Usage: reports/quickstart-cpu/run.sh [work dir, default runs/quickstart-report]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
work=${1:-runs/quickstart-report}
rm -rf "$work"
mkdir -p "$work"
export OMP_NUM_THREADS=1
tune=build/bin/ulysses-tune
$tune sweep experiments/quickstart-cpu.yaml --db "$work/results.db" | tee "$work/sweep-smart.log"
# The grid runs every point at every length: no budget (the experiment's is for the search).
$tune sweep experiments/quickstart-cpu.yaml --db "$work/results.db" --search grid \
  --max-trials 0 --wall-clock-s 0 \
  | tee "$work/sweep-grid.log"
$tune recommend --db "$work/results.db" --sweep quickstart-cpu --out "$work/recommended"
$tune recommend --db "$work/results.db" --sweep quickstart-cpu-grid --out "$work/recommended-grid"
$tune report --db "$work/results.db" --sweep quickstart-cpu --out "$work/report"
$tune list --db "$work/results.db" > "$work/list.txt"
python3 reports/quickstart-cpu/compare.py "$work/results.db" > "$work/comparison.md"
