#!/usr/bin/env bash
# The CPU baseline of reports/cpu-baseline/README.md: (a) fp32 GEMM throughput of Debian's
# LibTorch 1.13 ("before") and the venv's torch 2.13 ("after"), plus ulysses-bench's Gemm cases;
# (b) one training step of the same model on the same tokens, ulysses-train (plain, all memory
# features) against Hugging Face transformers (SDPA, gradient checkpointing off/on), interleaved;
# (c) the longest sequence each trains under the same per-process memory cap.
#
#   reports/cpu-baseline/run.sh                 # all parts, about 25 minutes on 2 cores
#   PARTS="gemm" reports/cpu-baseline/run.sh    # one part: gemm | train | maxlen (space separated)
#
# Needs: build/bin/ulysses-train and ulysses-bench (cmake --build build), the venv (.venv, with
# transformers) and, for "before", Debian's python3-torch (apt-get install python3-torch).
# Everything lands in $OUT_DIR (default /tmp/ulysses-cpu-baseline): logs, run configs, one
# directory per run, gemm.jsonl, train.jsonl, maxlen.jsonl, and the tables on stdout (run.log).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PY=${ULYSSES_PYTHON:-$ROOT/.venv/bin/python}
SYS_PY=${SYSTEM_PYTHON:-/usr/bin/python3}
BIN=${ULYSSES_BIN_DIR:-$ROOT/build/bin}
OUT=${OUT_DIR:-/tmp/ulysses-cpu-baseline}
PARTS=${PARTS:-"gemm train maxlen"}
THREADS=${THREADS:-2}
LENGTHS=${LENGTHS:-1024,4096,16384}
REPS=${REPS:-3}              # interleaved rounds below LONG_FROM tokens
REPS_LONG=${REPS_LONG:-1}    # rounds at >= LONG_FROM tokens (two steps each, as below)
LONG_FROM=${LONG_FROM:-16384}
LIMIT_GIB=${LIMIT_GIB:-1}    # part (c): per-process cap beyond the baseline address space
GEMM_N=${GEMM_N:-2048}
# The model: a small Llama (GQA, untied 32K vocabulary), as LlamaConfig fields.
SHAPE=${SHAPE:-'{"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 768, "vocab_size": 32000,
 "tie_word_embeddings": false, "rms_norm_eps": 1e-05, "max_position_embeddings": 262144}'}

mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
export OMP_NUM_THREADS=$THREADS

echo "== ulysses-tune CPU baseline, $(date -u +%FT%TZ)"
echo "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')" \
     "(working tree $(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l) changed files)"
echo "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
     "$(free -g | awk '/Mem:/ {print $2}') GiB; threads per process $THREADS"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" -c 'import torch, transformers; print("venv: torch", torch.__version__, "transformers", transformers.__version__)'

part_gemm() {
  echo "== (a) fp32 GEMM ${GEMM_N}^3, median of timed torch.mm calls"
  : > "$OUT/gemm.jsonl"
  # Interleaved: after, before, after (Debian's 1.13 on reference BLAS takes ~8 s per call).
  "$PY" "$HERE/gemm.py" --n "$GEMM_N" --reps 7 --threads "$THREADS" | tee -a "$OUT/gemm.jsonl"
  if "$SYS_PY" -c 'import torch' 2>/dev/null; then
    "$SYS_PY" "$HERE/gemm.py" --n "$GEMM_N" --reps 3 --threads "$THREADS" | tee -a "$OUT/gemm.jsonl"
  else
    echo "before: $SYS_PY has no torch (apt-get install python3-torch); skipped"
  fi
  "$PY" "$HERE/gemm.py" --n "$GEMM_N" --reps 7 --threads "$THREADS" | tee -a "$OUT/gemm.jsonl"
  if [ -x "$BIN/ulysses-bench" ]; then
    echo "== ulysses-bench Gemm cases at the model's shapes (4096 tokens)"
    "$BIN/ulysses-bench" --config "$OUT/bench.yaml" --tokens 4096 \
        --benchmark_filter=Gemm --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
        --benchmark_out="$OUT/bench-gemm.json" --benchmark_out_format=json \
      || echo "ulysses-bench failed (status $?)"
  else
    echo "ulysses-bench not built; skipped"
  fi
}

make_model() {
  if [ ! -f "$OUT/model/config.json" ] || [ ! -f "$OUT/tokens.u16" ]; then
    # 4M tokens: enough for every sample the runs below read (sample 0.. of up to 1M tokens).
    "$PY" "$HERE/make_model.py" --out "$OUT/model" --tokens "$OUT/tokens.u16" \
        --num-tokens 4194304 --shape "$SHAPE" 2>&1 | grep -v -i warn
  fi
  cat > "$OUT/bench.yaml" <<EOF
model: {load: "$OUT/model"}
mesh: {sp: 1, dp: 1}
sequence: {length: 4096}
EOF
}

compare() {
  "$PY" "$HERE/compare.py" "$1" --bin "$BIN" --python "$PY" --model-dir "$OUT/model" \
      --tokens "$OUT/tokens.u16" --out "$OUT" --threads "$THREADS" "${@:2}"
}

make_model
for part in $PARTS; do
  case $part in
    gemm) part_gemm ;;
    train)
      echo "== (b) one training step: ulysses-train vs transformers, interleaved"
      compare train --lengths "$LENGTHS" --reps "$REPS" --reps-long "$REPS_LONG" \
          --long-from "$LONG_FROM" ;;
    maxlen)
      echo "== (c) longest sequence under memory.limit_gib / RLIMIT_AS = baseline + $LIMIT_GIB GiB"
      compare maxlen --limit-gib "$LIMIT_GIB" ;;
    *) echo "unknown part '$part' (gemm | train | maxlen)"; exit 2 ;;
  esac
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
