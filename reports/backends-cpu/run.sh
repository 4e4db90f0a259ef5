#!/usr/bin/env bash
# Ours against DeepSpeed on this machine's CPU: makes a tiny Llama checkpoint with transformers
# (runs/backends-cpu/model, once), runs experiment.yaml beside this script (both backends on every
# configuration) into runs/backends-cpu/results.db and writes its report to
# runs/backends-cpu/report/.
# Environment: PYTHON, the Python with torch, transformers and deepspeed (default: the project's
# .venv). Needs build/bin (scripts/build.sh). RESUME=1 continues an interrupted sweep.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
py=${PYTHON:-$root/.venv/bin/python}
out=runs/backends-cpu
mkdir -p "$out"
if [ ! -f "$out/model/config.json" ]; then
  echo '{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 4096,
         "tie_word_embeddings": false}' |
    "$py" bench/compare/make_model.py --shape - --out "$out/model" --tokens "$out/unused.tokens" \
      --num-tokens 1 --make model
fi
export OMP_NUM_THREADS=1
build/bin/ulysses-tune sweep reports/backends-cpu/experiment.yaml --db "$out/results.db" \
  --python "$py" ${RESUME:+--resume}
build/bin/ulysses-tune report --db "$out/results.db" --out "$out/report"
