#!/usr/bin/env bash
# GPU smoke run (one H100/H200): ulysses-train on CUDA in the configurations that broke or
# bloated on GPUs before: bf16 with each SDPA kernel family, a memory cap, tiled MLP +
# tiled loss + checkpointing + activation and optimizer offload, packed documents, and two ranks
# with Gloo over CUDA tensors (one GPU cannot hold two NCCL ranks). Each run's exit status and
# final loss go to OUT/gpu-smoke.tsv; compare the losses with the fp32 CPU run of the same config.
# Usage: scripts/gpu-smoke.sh BUILD_DIR OUT_DIR
# Environment: SMOKE_DEVICE=cpu runs the same list on CPU (fp32; the runs that need CUDA, bf16 and
# the fused SDPA kernels, get a row with exit "skipped"), SMOKE_STEPS (default 20) the steps of
# each run, SMOKE_ONLY (comma-separated run names) runs only those, SMOKE_DEADLINE (seconds since
# the epoch) starts no run after it (each run not started gets a row with exit "deadline").
# Exit status: 0 when every run that ran exited 0, else 1.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=$(cd "${1:?BUILD_DIR}" && pwd)
out=${2:?OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
device=${SMOKE_DEVICE:-cuda}
steps=${SMOKE_STEPS:-20}
train="$build/bin/ulysses-train"
tune="$build/bin/ulysses-tune"
base=(--config experiments/runs/tiny-cpu.yaml --set train.device="$device" --set train.steps="$steps"
      --set sequence.length=1024 --set mesh.dp=1 --set mesh.sp=1)
printf 'name\texit\tfinal_loss\tpeak_mem_bytes\tstep_ms_median\tattention_kernels\n' \
  > "$out/gpu-smoke.tsv"
failures=0
run() {  # name, then extra --set arguments (or a launcher command line after "--launch")
  local name=$1; shift
  local dir="$out/runs/$name" status
  [[ -z ${SMOKE_ONLY:-} || ",$SMOKE_ONLY," == *",$name,"* ]] || return 0
  if [[ -n ${SMOKE_DEADLINE:-} ]] && (( $(date +%s) >= SMOKE_DEADLINE )); then
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" deadline - - - - | tee -a "$out/gpu-smoke.tsv"
    return
  fi
  if [[ $device == cpu && ( " $* " == *precision=bf16* || " $* " == *backend=flash* ||
        " $* " == *backend=efficient* || " $* " == *backend=cudnn* ) ]]; then
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" skipped - - - - | tee -a "$out/gpu-smoke.tsv"
    return
  fi
  mkdir -p "$dir"
  if [[ ${1:-} == --launch ]]; then
    shift
    "$tune" launch experiments/runs/tiny-cpu.yaml "$@" --set output.dir="$dir" >"$dir/log" 2>&1
  else
    "$train" "${base[@]}" "$@" --set output.dir="$dir" >"$dir/log" 2>&1
  fi
  status=$?
  local fields
  # final loss, peak, median step time and the attention kernels the run recorded
  fields=$(python3 -c "
import json; s = json.load(open('$dir/summary.json'))
print('\t'.join(str(v) for v in (s['final_loss'], s['peak_mem_bytes'], s['step_ms_median'],
                                  ','.join(s.get('attention_kernels', [])) or '-')))" 2>/dev/null)
  printf '%s\t%s\t%s\n' "$name" "$status" "${fields:-$(printf -- '-\t-\t-\t-')}" |
    tee -a "$out/gpu-smoke.tsv"
  [[ $status -eq 0 ]] || { tail -5 "$dir/log"; failures=$((failures + 1)); }
}
run fp32_auto
run bf16_auto --set memory.precision=bf16
run bf16_flash --set memory.precision=bf16 --set attention.backend=flash
run bf16_efficient --set memory.precision=bf16 --set attention.backend=efficient
run bf16_cudnn --set memory.precision=bf16 --set attention.backend=cudnn
run bf16_math --set memory.precision=bf16 --set attention.backend=math
run bf16_limit --set memory.precision=bf16 --set memory.limit_gib=4
run bf16_alst --set memory.precision=bf16 --set memory.tiled_mlp=4 --set memory.tiled_loss=4 \
  --set memory.checkpointing=true --set memory.offload_activations=true \
  --set memory.offload_optimizer=true
run bf16_packed --set memory.precision=bf16 --set data.pack=true
# On CPU the two-rank run is fp32 (bf16 needs CUDA); on CUDA it is the bf16 run it always was.
precision=bf16
[[ $device == cpu ]] && precision=fp32
run gloo_2ranks_sp2 --launch --nproc 2 --set train.device="$device" --set train.steps="$steps" \
  --set sequence.length=1024 --set mesh.dp=1 --set mesh.sp=2 --set comm.backend=gloo \
  --set memory.precision=$precision
# Packed documents past the dense-mask size: flash and auto run every document of the batch in one
# varlen flash launch (kernel flash_varlen); the efficient kernel runs one call per document. Same
# tokens, so the losses agree to bf16 rounding and the step times compare the two paths.
run bf16_packed_16k --set memory.precision=bf16 --set data.pack=true --set sequence.length=16384 \
  --set train.steps=5
run bf16_packed_16k_per_document --set memory.precision=bf16 --set data.pack=true \
  --set sequence.length=16384 --set train.steps=5 --set attention.backend=efficient
[[ $failures -eq 0 ]]
