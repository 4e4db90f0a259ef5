#!/usr/bin/env bash
# The offloaded optimizer's host update beside backward (optim.overlap_host_update) against the
# update after backward: one ulysses-train run of each, alternating, REPEATS times, on one rank of
# this machine's CPU with ALST's memory features (tiled MLP and loss, checkpointing, activation
# and optimizer offload). Prints each run's median step time and summary.json's
# optimizer_overlap. Usage: bench/overlapped_host_update.sh [REPEATS] [extra --set ...]
set -euo pipefail
repeats=${1:-2}
shift || true
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${ULYSSES_BIN_DIR:-$here/build/bin}/ulysses-train
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq 1 "$repeats"); do
  for overlap in true false; do
    dir=$out/$overlap-$r
    "$bin" --config "$here/experiments/runs/tiny-cpu.yaml" \
      --set mesh.dp=1 --set mesh.sp=1 --set train.steps=8 --set profile.warmup_steps=2 \
      --set model.hidden_size=512 --set model.num_layers=8 --set model.intermediate_size=1376 \
      --set model.vocab_size=16000 --set sequence.length=128 \
      --set memory.tiled_mlp=2 --set memory.tiled_loss=2 --set memory.checkpointing=true \
      --set memory.offload_activations=true --set memory.offload_optimizer=true \
      --set optim.grad_clip=1000 --set optim.overlap_host_update=$overlap \
      --set output.dir="$dir" "$@" >"$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
    python3 - "$dir" "$overlap" <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
o = s["optimizer_overlap"]
steps = o["steps"]
print(f"overlap_host_update={sys.argv[2]:5}  step_ms_median {s['step_ms_median']:8.1f}  "
      f"optimizer: during backward {o['host_ms_during_backward'] / steps:6.1f} ms/step, "
      f"after {o['ms_after_backward'] / steps:6.1f} ms/step, hidden {o['hidden_fraction']:.2f}")
PY
  done
done
