#!/usr/bin/env bash
# The CPU baseline of reports/cpu-baseline/README.md: (a) fp32 GEMM throughput of Debian's
# LibTorch 1.13 ("before") and the venv's torch 2.13 ("after"), plus ulysses-bench's Gemm cases;
# (b) one training step of the same model on the same tokens, ulysses-train (plain, all memory
# features) against Hugging Face transformers (SDPA, gradient checkpointing off/on), interleaved;
# (c) the longest sequence each trains under the same per-process memory cap. (b) and (c) run
# bench/compare/compare.py, the one harness for this comparison (bench/compare/README.md).
#
#   reports/cpu-baseline/run.sh                 # all parts, about 25 minutes on 2 cores
#   PARTS="gemm" reports/cpu-baseline/run.sh    # one part: gemm | train | maxlen (space separated)
#
# Needs: build/bin/ulysses-train and ulysses-bench (cmake --build build), the venv (.venv, with
# transformers) and, for "before", Debian's python3-torch (apt-get install python3-torch).
# Everything lands in $OUT_DIR (default runs/cpu-baseline): gemm.jsonl, bench-gemm.json, the
# harness's directory compare/ (results.jsonl: one record per process; summary.md: the tables;
# runs/: each run's files), and the log of it all (run.log).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PY=${ULYSSES_PYTHON:-$ROOT/.venv/bin/python}
SYS_PY=${SYSTEM_PYTHON:-/usr/bin/python3}
BIN=${ULYSSES_BIN_DIR:-$ROOT/build/bin}
OUT=${OUT_DIR:-$ROOT/runs/cpu-baseline}
PARTS=${PARTS:-"gemm train maxlen"}
THREADS=${THREADS:-2}
LENGTHS=${LENGTHS:-1024,4096,16384}
REPS=${REPS:-3}              # interleaved rounds
LIMIT_GIB=${LIMIT_GIB:-1}    # part (c): per-process cap beyond the baseline address space
GEMM_N=${GEMM_N:-2048}
# The model: a small Llama (GQA, untied 32K vocabulary), as LlamaConfig fields.
SHAPE=${SHAPE:-'{"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 768, "vocab_size": 32000,
 "tie_word_embeddings": false, "rms_norm_eps": 1e-05}'}

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

compare() {  # the harness, on one model and token file kept in $OUT/compare
  "$PY" "$ROOT/bench/compare/compare.py" run --out "$OUT/compare" --device cpu --dtype fp32 \
      --model "$SHAPE" --hardware cpu-local --bin "$BIN" --python "$PY" --threads "$THREADS" \
      --max-length 262144 "$@"
}

# ulysses-bench's Gemm cases at the model's shapes.
cat > "$OUT/bench.yaml" <<EOF
model: {hidden_size: 256, num_layers: 2, num_heads: 4, num_kv_heads: 2, head_dim: 64,
        intermediate_size: 768, vocab_size: 32000, tie_embeddings: false}
mesh: {sp: 1, dp: 1}
sequence: {length: 4096}
EOF
for part in $PARTS; do
  case $part in
    gemm) part_gemm ;;
    train)
      echo "== (b) one training step: ulysses-train vs transformers, interleaved"
      compare --parts throughput --configs ours-plain,hf-nockpt,ours-alst,hf \
          --lengths "$LENGTHS" --reps "$REPS" --warmup 1 --steps 1 ;;
    maxlen)
      echo "== (c) longest sequence under memory.limit_gib / RLIMIT_AS = baseline + $LIMIT_GIB GiB"
      compare --parts maxlen --configs ours-alst,ours-tiled,hf \
          --limit-gib "$LIMIT_GIB" --start 1024 --granule 256 ;;
    *) echo "unknown part '$part' (gemm | train | maxlen)"; exit 2 ;;
  esac
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
