#!/usr/bin/env bash
# Memory benchmark on CPU (a measurement, not a test): one rank of ulysses-train at a
# long sequence on a model whose LM logits and MLP intermediates dominate memory, run plain and
# with each memory feature, reading peak_host_bytes (RSS high-water mark of the rank) and the
# median step time from summary.json. Then the same two runs under memory.limit_gib: plain must
# end as "out of memory" (exit 12) while the all-features run trains.
#
#   scripts/bench-memory-cpu.sh                        # build/bin, 4096 tokens, 1 step
#   ULYSSES_BIN_DIR=build-x/bin LENGTH=8192 LIMIT_GIB=3 scripts/bench-memory-cpu.sh
#
# Prints a markdown table (pasted into reports/memory-cpu/README.md). Runs go to $OUT_DIR.
set -euo pipefail

HOME_DIR=$(cd "$(dirname "$0")/.." && pwd)
BIN_DIR=${ULYSSES_BIN_DIR:-$HOME_DIR/build/bin}
OUT_DIR=${OUT_DIR:-/tmp/ulysses-bench-memory-cpu}
LENGTH=${LENGTH:-4096}
STEPS=${STEPS:-1}
LIMIT_GIB=${LIMIT_GIB:-2}
TILES=${TILES:-8}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # 2 threads on 2 busy cores: OpenMP barriers dominate small ops

mkdir -p "$OUT_DIR"
CONFIG=$OUT_DIR/run.yaml
cat >"$CONFIG" <<EOF
# Per token the logits hold V = 32000 floats and the MLP 4 x ffn = 16384 floats per layer, against
# h = 16 for the hidden state: logits and MLP intermediates dominate. h is tiny because this
# machine's LibTorch runs matmuls on reference BLAS (~1 GFLOP/s); memory per token does not
# depend on h. 2 heads keep the math attention's [hq, sl, sl] scores below the logits.
model: {hidden_size: 16, num_layers: 2, num_heads: 2, num_kv_heads: 1, head_dim: 8,
        intermediate_size: 4096, vocab_size: 32000}
mesh: {sp: 1, dp: 1}
sequence: {length: $LENGTH, micro_batch: 1}
train: {steps: $STEPS, device: cpu}
profile: {warmup_steps: 1}
EOF

# name | --set overrides
CASES=(
  "plain|"
  "tiled loss|--set memory.tiled_loss=$TILES"
  "tiled MLP|--set memory.tiled_mlp=$TILES"
  "checkpointing|--set memory.checkpointing=true"
  "checkpointing + offload|--set memory.offload_activations=true"
  "all|--set memory.tiled_loss=$TILES --set memory.tiled_mlp=$TILES --set memory.offload_activations=true --set memory.offload_optimizer=true"
)

# run <dir name> <overrides...>: prints "<exit status>"
run() {
  local dir=$OUT_DIR/$1
  shift
  rm -rf "$dir"
  set +e
  "$BIN_DIR/ulysses-train" --config "$CONFIG" --set output.dir="$dir" "$@" \
    >"$dir.log" 2>"$dir.err"
  local status=$?
  set -e
  echo "$status"
}

summary_field() {  # <dir> <python expression over s = summary.json>
  python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print($2)" "$1/summary.json"
}

echo "ulysses-train at $LENGTH tokens, $STEPS steps, OMP_NUM_THREADS=$OMP_NUM_THREADS, tiles $TILES"
echo
echo "| configuration | peak host RSS (GiB) | vs plain | median step (s) | loss step 1 |"
echo "|---|---:|---:|---:|---:|"
plain_peak=""
for entry in "${CASES[@]}"; do
  name=${entry%%|*}
  sets=${entry#*|}
  slug=$(echo "$name" | tr ' +' '__')
  # shellcheck disable=SC2086
  status=$(run "$slug" $sets)
  if [[ $status != 0 ]]; then
    echo "| $name | failed (exit $status: $(head -c 120 "$OUT_DIR/$slug.err")) | | | |"
    continue
  fi
  peak=$(summary_field "$OUT_DIR/$slug" "s['peak_host_bytes']")
  [[ -z $plain_peak ]] && plain_peak=$peak
  step_s=$(summary_field "$OUT_DIR/$slug" "s['step_ms_median'] / 1000")
  loss=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())['loss'])" \
    "$OUT_DIR/$slug/metrics.jsonl")
  python3 -c "import sys; p,b,t,l=map(float,sys.argv[2:6]); print(f'| {sys.argv[1]} | {p/2**30:.2f} | {p/b:.2f}x | {t:.1f} | {l:.6f} |')" \
    "$name" "$peak" "$plain_peak" "$step_s" "$loss"
done

echo
echo "Under memory.limit_gib=$LIMIT_GIB (RLIMIT_AS = address space at start + limit):"
echo
echo "| configuration | exit status | stderr |"
echo "|---|---:|---|"
for entry in "${CASES[0]}" "${CASES[${#CASES[@]}-1]}"; do
  name=${entry%%|*}
  sets=${entry#*|}
  slug=limited_$(echo "$name" | tr ' +' '__')
  # shellcheck disable=SC2086
  status=$(run "$slug" --set memory.limit_gib="$LIMIT_GIB" $sets)
  echo "| $name | $status | $(head -n 1 "$OUT_DIR/$slug.err" | cut -c1-110) |"
done
