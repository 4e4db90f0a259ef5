# Shell helpers of the GPU campaigns (scripts/gpu-campaign.sh and scripts/campaign/quick.sh),
# sourced by both. Inside a stage, $dir is the stage's directory.

# x CMD...: log the command into the stage's commands file, run it, log its exit status.
x() {
  printf '$ %s\n' "$(printf '%q ' "$@")" >> "$dir/commands"
  "$@"
  local rc=$?
  printf '  exit %s\n' "$rc" >> "$dir/commands"
  return $rc
}

# skip_stage REASON...: end the stage as skipped (exit 77), with its reason for the summary.
skip_stage() { echo "$*" > "$dir/skip-reason"; exit 77; }

# The GPU's name and its hardware profile (profiles/hardware): sets gpu and hardware.
detect_gpu() {
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -n1)
  case $gpu in *H200*) hardware=h200 ;; *) hardware=h100-sxm ;; esac
}

# The dry runs' comparison model: a tiny Llama as a JSON object of LlamaConfig fields.
DRY_COMPARE_MODEL='{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 4096, "tie_word_embeddings": false}'

# resolve_python NAME PY DRY ROOT: sets python to the absolute path of the Python the campaign runs
# with, or prints one line and returns 2. PY empty: $PYTHON if set; else, for a dry run, the
# project's venv (ULYSSES_VENV, else ROOT/.venv, which scripts/install-deps.sh makes) where it
# exists; else python3. The Python must import torch (one line naming --python where it cannot).
resolve_python() {
  local name=$1 chosen=$2 dry=$3 root=$4 venv
  if [ -z "$chosen" ]; then
    venv=${ULYSSES_VENV:-$root/.venv}
    if [ -n "${PYTHON:-}" ]; then chosen=$PYTHON
    elif [ "$dry" = 1 ] && [ -x "$venv/bin/python" ]; then chosen=$venv/bin/python
    else chosen=python3
    fi
  fi
  command -v "$chosen" > /dev/null || { echo "$name: --python $chosen: not found" >&2; return 2; }
  python=$(command -v "$chosen")
  case $python in /*) ;; *) python=$(cd "$(dirname "$python")" && pwd)/$(basename "$python") ;; esac
  if ! "$python" -c 'import torch' > /dev/null 2>&1; then
    echo "$name: --python $python cannot import torch; name a Python that has PyTorch with --python PY (scripts/install-deps.sh makes one in .venv)" >&2
    return 2
  fi
}
