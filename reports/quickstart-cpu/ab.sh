#!/usr/bin/env bash
# The two recommendations (smart search vs grid) measured back to back, interleaved, under the same
# machine load: each recommended.yaml runs REPS times (3 steps, 1 warmup), and the median tokens/s
# per rank of each is printed. Usage: ab.sh SMART_DIR GRID_DIR [REPS]   (recommend --out dirs)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
smart=$1 grid=$2 reps=${3:-3}
out=$(mktemp -d)
export OMP_NUM_THREADS=1
for i in $(seq "$reps"); do
  for name in smart grid; do
    dir=${!name}
    world=$(python3 -c "import yaml,sys; c=yaml.safe_load(open(sys.argv[1])); print(c['mesh']['dp']*c['mesh']['sp'])" "$dir/recommended.yaml")
    "$root/build/bin/ulysses-tune" launch "$dir/recommended.yaml" --nproc "$world" \
      --set train.steps=3 --set profile.warmup_steps=1 --set output.dir="$out/$name-$i" > /dev/null
    python3 -c "import json,sys; print(sys.argv[1], json.load(open(sys.argv[2]))['tokens_per_s_per_rank_median'])" \
      "$name" "$out/$name-$i/summary.json"
  done
done | python3 -c "
import sys, statistics
runs = {}
for line in sys.stdin:
    name, tps = line.split(); runs.setdefault(name, []).append(float(tps))
for name, v in runs.items():
    print(f'{name}: tokens/s per rank {[round(x) for x in v]}, median {statistics.median(v):.0f}')
s, g = statistics.median(runs['smart']), statistics.median(runs['grid'])
print(f'smart / grid = {100 * s / g:.1f}%')
"
rm -rf "$out"
