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
