#!/usr/bin/env bash
# The main job on a CPU machine: install what is missing, build, then the tuner end to end on
# 4 CPU ranks: sweep the quickstart experiment (real ulysses-train trials, some out of memory by
# design) -> recommend -> report -> launch the tuned job for a short run. Everything goes to
# runs/quickstart/ (results.db, recommended/, report/, tuned/), made fresh on each run (only a
# directory an earlier quickstart made is replaced).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# ulysses-bench: for `calibrate`. DeepSpeed's ops are left to scripts/test.sh: nothing here runs them.
ULYSSES_SKIP_DS_OPS=1 scripts/build.sh ulysses_train ulysses_tune ulysses_bench
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
out=runs/quickstart
if [ -e "$out" ] && [ ! -f "$out/.quickstart" ] && [ -n "$(ls -A "$out")" ]; then
  echo "error: $out exists and was not made by the quickstart; move it away first" >&2
  exit 2
fi
rm -rf "$out"
mkdir -p "$out"
touch "$out/.quickstart"
tune=build/bin/ulysses-tune
$tune sweep experiments/quickstart-cpu.yaml --db "$out/results.db"
$tune recommend --db "$out/results.db" --out "$out/recommended"
$tune report --db "$out/results.db" --out "$out/report"
# The tuned job through the launch.sh that recommend wrote (it expects build/bin on PATH).
PATH="$root/build/bin:$PATH" "$out/recommended/launch.sh" --set train.steps=4 \
  --set output.dir="$root/$out/tuned" "$@"
echo "sweep: $out/results.db  recommendation: $out/recommended/WHY.md  report: $out/report/README.md"
echo "tuned run: $out/tuned/metrics.jsonl"
