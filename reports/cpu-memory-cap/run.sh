#!/usr/bin/env bash
# How far a CPU trial's peak address space varies between identical runs, with glibc's default
# (moving) mmap threshold and with a fixed one. Runs the quickstart's model, world and memory limit
# (experiments/quickstart-cpu.yaml) over 4 trials (sp 2 and 4, tiled loss 1 and 8, 4096 tokens)
# RUNS times per allocator setting and prints, per trial, its status and the peak address space
# above the rank's start-up baseline (summary.json max_rank_peak_address_space_bytes), which is what
# memory_limit_gib caps on a CPU.
#   reports/cpu-memory-cap/run.sh            # RUNS=10, OUT_DIR=/tmp/ulysses-cpu-memory-cap
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${ULYSSES_BIN_DIR:-$root/build/bin}
runs=${RUNS:-10}
out=${OUT_DIR:-/tmp/ulysses-cpu-memory-cap}
python=${ULYSSES_PYTHON:-python3}
[ -e "$out" ] && { echo "run.sh: OUT_DIR $out exists; remove it or pick another" >&2; exit 2; }
mkdir -p "$out"
export OMP_NUM_THREADS=1
awk '/^space:/ { skip = 1; next } skip && /^$/ { skip = 0; next } !skip' \
  "$root/experiments/quickstart-cpu.yaml" | sed 's/^search: .*/search: {method: grid}/' \
  > "$out/grid.yaml"
cat >> "$out/grid.yaml" << 'YAML'
space:
  mesh.sp: [2, 4]
  memory.tiled_loss: [1, 8]
  sequence.length: [4096]
YAML
for variant in default fixed-256k; do
  allocator=()  # the environment of the sweep and its trials' ranks
  [ "$variant" = fixed-256k ] && allocator=(MALLOC_MMAP_THRESHOLD_=262144)
  for i in $(seq "$runs"); do
    dir=$out/$variant-$i
    env "${allocator[@]}" "$bin/ulysses-tune" sweep "$out/grid.yaml" --name q --db "$dir.db" \
      --runs-dir "$dir" > "$dir.log" 2>&1
  done
done
"$python" - "$out" "$runs" << 'PY'
import collections, json, os, sqlite3, sys
out, runs = sys.argv[1], int(sys.argv[2])
rows = collections.defaultdict(list)
for variant in ("default", "fixed-256k"):
    for i in range(1, runs + 1):
        db = sqlite3.connect(f"{out}/{variant}-{i}.db")
        for trial_id, key, status in db.execute("SELECT id, key, status FROM trials ORDER BY key"):
            summary = f"{out}/{variant}-{i}/{trial_id}/out/summary.json"
            peak = ""
            if status == "ok" and os.path.exists(summary):
                with open(summary) as f:
                    peak = "%.1f" % (json.load(f)["max_rank_peak_address_space_bytes"] / 1e6)
            rows[(variant, key)].append(peak if status == "ok" else status)
print("| allocator | trial | per run: peak MB above the baseline, or status |")
print("|---|---|---|")
for (variant, key), values in sorted(rows.items()):
    print(f"| {variant} | {key} | {' '.join(values)} |")
PY
