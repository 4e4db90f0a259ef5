#!/usr/bin/env bash
# The GPU measurement campaign in one command: on a node with one or more GPUs, everything a first
# GPU run has to measure, as stages of under 10 minutes each, into OUT, with one OUT/summary.md.
#
# Usage: scripts/gpu-campaign.sh OUT [--dry-run] [--stages LIST] [--build-dir DIR] [--deps PREFIX]
#                                    [--python PY] [--list]
#        scripts/gpu-campaign.sh --quick OUT [--dry-run] [--budget S] ...   (see --quick --help)
#   --quick        a new node in one command under one deadline (default 540 s, the build
#                  included) into an OUT of at most 8 files: scripts/campaign/quick.sh
#   OUT            output directory: new, empty, or one this script made (it holds
#                  .ulysses-campaign); any other directory is refused
#   --dry-run      the same stages on CPU with tiny shapes (a few minutes), so the campaign is
#                  known to work before a GPU minute is spent; the summary has the same layout
#   --stages LIST  run only these stages (comma-separated; see --list), dependencies permitting
#   --build-dir    the build to use or make (default: build)
#   --deps PREFIX  the libraries' prefix, for the build stage (see scripts/build-gpu.sh)
#   --python PY    the Python with PyTorch and transformers (default: $PYTHON; else, with --dry-run, the project's .venv where it exists; else python3)
#   --list         print the stages, their result files and what each needs, and exit
# Environment: NSYS (Nsight Systems; default: nsys on PATH or in the CUDA toolkit),
# CAMPAIGN_STAGE_TIMEOUT (seconds per stage, default 570).
#
# Stages, in order (each writes OUT/<stage>/; a stage whose result file exists is skipped, so a
# second invocation resumes; a failed stage is recorded and the stages that do not need it run):
#   build             scripts/build-gpu.sh against PY's PyTorch if needed; `--version` line
#   smoke             scripts/gpu-smoke.sh: bf16 per SDPA kernel, memory cap, ALST features, ...
#   compare-throughput  bench/compare: tokens/s and MFU, ulysses-train vs transformers, interleaved
#   compare-maxlen-ours / compare-maxlen-theirs  bench/compare: the longest length each trains
#   sweep             the one-GPU sweep (four of experiments/gpu-1x.yaml's configurations, their
#                     longest length and a curve of shorter ones, on a 1B model, 7 minutes)
#                     + report + recommend
#   plan-fit          ulysses-tune plan --fit on the sweep, and plans with the fit
#   alst-run          ALST features with and without optimizer offload: offload time, peak
#                     reserved vs allocated, host syncs per step (CUDA runtime calls counted)
#   profile           the same run under Nsight Systems (ulysses-tune profile): kernel split,
#                     host syncs and copy time per step from the trace (skipped without nsys)
#   findings          what the runs above say about offload copies, memory and host syncs
# Exit status: 0 when every stage that ran succeeded (or was skipped), 1 when one failed, 2 bad
# usage or an OUT this script did not make.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
campaign=$root/scripts/campaign
# shellcheck source=campaign/common.sh
source "$campaign/common.sh"
STAGES=(build smoke compare-throughput compare-maxlen-ours compare-maxlen-theirs sweep plan-fit
        alst-run profile findings)
declare -A RESULT=(
  [build]=build/version.txt [smoke]=smoke/gpu-smoke.tsv
  [compare-throughput]=compare-throughput/bench/summary.md
  [compare-maxlen-ours]=compare-maxlen-ours/bench/summary.md
  [compare-maxlen-theirs]=compare-maxlen-theirs/bench/summary.md
  [sweep]=sweep/report/README.md [plan-fit]=plan-fit/plan.txt [alst-run]=alst-run/alst-run.json
  [profile]=profile/syncs.json [findings]=findings/findings.md)
declare -A NEEDS=(
  [build]="" [smoke]=build [compare-throughput]=build [compare-maxlen-ours]=build
  [compare-maxlen-theirs]=build [sweep]=build [plan-fit]=sweep [alst-run]=build [profile]=build
  [findings]=alst-run)
MARKER=.ulysses-campaign

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
for arg in "$@"; do [ "$arg" = --quick ] && exec "$root/scripts/campaign/quick.sh" "$@"; done
out="" dry=0 only="" build="" deps="" python="" list=0
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry=1; shift ;;
    --stages) only=${2:?--stages LIST}; shift 2 ;;
    --build-dir) build=${2:?--build-dir DIR}; shift 2 ;;
    --deps) deps=${2:?--deps PREFIX}; shift 2 ;;
    --python) python=${2:?--python PY}; shift 2 ;;
    --list) list=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "gpu-campaign: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [ -z "$out" ] || { echo "gpu-campaign: one OUT only" >&2; exit 2; }; out=$1; shift ;;
  esac
done
if [ "$list" = 1 ]; then
  printf '%-22s %-34s %s\n' stage "result file" needs
  for s in "${STAGES[@]}"; do printf '%-22s %-34s %s\n' "$s" "${RESULT[$s]}" "${NEEDS[$s]:--}"; done
  exit 0
fi
[ -n "$out" ] || { echo "usage: scripts/gpu-campaign.sh OUT [--dry-run] [--stages LIST] (see --help)" >&2; exit 2; }
for s in ${only//,/ }; do
  [ -n "${RESULT[$s]:-}" ] || { echo "gpu-campaign: --stages: unknown stage '$s' (see --list)" >&2; exit 2; }
done
mode=gpu
[ "$dry" = 1 ] && mode=dry-run
resolve_python "gpu-campaign" "$python" "$dry" "$root" || exit 2

# OUT: new, empty, or ours (and of the same mode).
if [ -e "$out" ] && [ ! -d "$out" ]; then echo "gpu-campaign: $out is not a directory" >&2; exit 2; fi
if [ -d "$out" ] && [ -n "$(ls -A "$out")" ]; then
  if [ ! -f "$out/$MARKER" ]; then
    echo "gpu-campaign: $out is not empty and was not made by this script (no $MARKER); choose a new OUT" >&2
    exit 2
  fi
  if ! grep -qx "mode=$mode" "$out/$MARKER"; then
    echo "gpu-campaign: $out holds a campaign of another mode ($(grep '^mode=' "$out/$MARKER")); choose a new OUT" >&2
    exit 2
  fi
fi
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
printf 'made by scripts/gpu-campaign.sh\nmode=%s\n' "$mode" > "$out/$MARKER"
build=${build:-$root/build}
case $build in /*) ;; *) build=$PWD/$build ;; esac
bin=$build/bin

# Settings: the GPU campaign's shapes, or the dry run's tiny ones.
if [ "$dry" = 1 ]; then
  device=cpu dtype=fp32 hardware=cpu-local model=tiny
  compare_model=$DRY_COMPARE_MODEL
  # Length searches of two probes (1024 fits under the 0.1 GiB cap, 2048 does not), as in the
  # quick campaign's dry run: a dry run checks that the stages work, not how long a sequence
  # fits (bench/compare's own dry run bisects further).
  compare_lengths=256 compare_reps=2 maxlen_start=1024 maxlen_ours=2048 maxlen_theirs=2048
  # No time budget: the searches end by their resolution, however busy the machine is.
  maxlen_extra=(--limit-gib 0.1 --granule 1024 --probe-timeout 300)
  alst_length=512
  export OMP_NUM_THREADS=1
  smoke_env=(SMOKE_DEVICE=cpu SMOKE_STEPS=3)
else
  device=cuda dtype=bf16 model=llama-3.2-1b
  detect_gpu
  compare_model=$model
  compare_lengths=8192,32768 compare_reps=2 maxlen_start=16384 maxlen_ours=262144
  maxlen_theirs=262144 maxlen_extra=(--granule 4096 --budget-s 300 --probe-timeout 240)
  alst_length=32768
  smoke_env=()
fi
stage_timeout=${CAMPAIGN_STAGE_TIMEOUT:-570}
$python - "$out/campaign.json" << EOF
import json, sys, time
json.dump({"mode": "$mode", "device": "$device", "dtype": "$dtype", "hardware": "$hardware",
           "model": "$model", "gpu": "${gpu:-}", "python": "$python", "build": "$build",
           "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
          open(sys.argv[1], "w"), indent=1)
EOF

# ---------------------------------------------------------------------------------------------
# Helpers for stages (run inside a stage: $dir is OUT/<stage>, cwd is the project root).


# alst_config VARIANT FILE STEPS OUTDIR: the ALST run config (both: activation + optimizer
# offload; activations: activation offload only).
alst_config() {
  local offload_optimizer=true
  [ "$1" = activations ] && offload_optimizer=false
  cat > "$2" << EOF
# written by scripts/gpu-campaign.sh: ALST features, offload $1
model: {preset: $model}
mesh: {sp: 1, dp: 1}
sequence: {length: $alst_length, micro_batch: 1, grad_accum: 1}
data: {source: synthetic, seed: 0}
memory: {precision: $dtype, tiled_mlp: auto, tiled_loss: auto, checkpointing: true,
         offload_activations: true, offload_optimizer: $offload_optimizer}
train: {device: $device, steps: $3}
profile: {warmup_steps: 1}
output: {dir: $4}
EOF
}

stage_build() {
  if [ "$dry" = 1 ]; then
    # The dry run builds nothing: it shows the commands and checks the existing binaries.
    x "$root/scripts/build-gpu.sh" --python "$python" ${deps:+--deps "$deps"} --print "$build" || return 1
  elif [ ! -x "$bin/ulysses-train" ] || ! "$bin/ulysses-train" --version | grep -q "cuda yes"; then
    x "$root/scripts/build-gpu.sh" --python "$python" ${deps:+--deps "$deps"} "$build" || return 1
  else  # built before: bring it up to date (seconds when nothing changed)
    x cmake --build "$build" -j"$(nproc)" --target ulysses_train ulysses_tune ulysses_bench || return 1
  fi
  if [ "$dry" = 0 ]; then  # the machine, for the record
    x nvidia-smi > "$dir/nvidia-smi.txt" 2>&1
    x "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name())' > "$dir/torch.txt" 2>&1
  fi
  for b in ulysses-train ulysses-tune ulysses-bench; do
    [ -x "$bin/$b" ] || { echo "no $bin/$b"; return 1; }
  done
  x "$bin/ulysses-train" --version > "$dir/version.txt" || return 1
  cat "$dir/version.txt"
  if [ "$dry" = 0 ] && ! grep -q "cuda yes" "$dir/version.txt"; then
    echo "this build has no CUDA: $(grep backends "$dir/version.txt")"
    rm -f "$dir/version.txt"
    return 1
  fi
}

stage_smoke() {
  x env "${smoke_env[@]}" "$root/scripts/gpu-smoke.sh" "$build" "$dir"
}

compare() {  # compare STAGE-OPTIONS...: bench/compare on the shared model in OUT/compare-data
  x "$python" "$root/bench/compare/compare.py" run --out "$dir/bench" --data "$out/compare-data" \
    --device "$device" --dtype "$dtype" --model "$compare_model" --hardware "$hardware" \
    --bin "$bin" --python "$python" "$@"
}

stage_compare-throughput() {
  compare --parts throughput --lengths "$compare_lengths" --reps "$compare_reps" \
    --configs "$(their_configs ours-alst,hf)" --max-length "$maxlen_ours" --timeout 240
}

their_configs() {  # the configurations, with DeepSpeed when PY imports it (not in the dry run)
  if [ "$dry" = 0 ] && "$python" -c 'import deepspeed' > /dev/null 2>&1; then echo "$1,ds-zero3"
  else echo "$1"; fi
}

stage_compare-maxlen-ours() {
  compare --parts maxlen --maxlen-configs ours-alst --configs ours-alst --start "$maxlen_start" \
    --max-length "$maxlen_ours" "${maxlen_extra[@]}"
}

stage_compare-maxlen-theirs() {
  local configs
  configs=$(their_configs hf)
  compare --parts maxlen --maxlen-configs "$configs" --configs "$configs" \
    --start "$maxlen_start" --max-length "$maxlen_theirs" "${maxlen_extra[@]}"
}

stage_sweep() {
  x "$python" "$campaign/sweep_experiment.py" --mode "$mode" --hardware "$hardware" \
    --model "$model" --out "$dir/experiment.yaml" "$root/experiments/gpu-1x.yaml" || return 1
  x "$bin/ulysses-tune" sweep "$dir/experiment.yaml" --db "$dir/results.db" || return 1
  x "$bin/ulysses-tune" list --db "$dir/results.db" --sweep "campaign-$mode" > "$dir/trials.txt"
  x "$bin/ulysses-tune" recommend --db "$dir/results.db" --out "$dir/recommended"
  x "$bin/ulysses-tune" report --db "$dir/results.db" --out "$dir/report"
}

stage_plan-fit() {
  local db=$out/sweep/results.db
  x "$bin/ulysses-tune" plan --fit "$db" --out "$dir/fit.json" > "$dir/fit.txt" || return 1
  cat "$dir/fit.txt"
  x "$bin/ulysses-tune" plan --db "$db" --model "$model" --hardware "$hardware" --world 1 \
    > "$dir/plan.txt.tmp" || return 1
  if [ "$dry" = 0 ]; then  # the fit on 1B trials, applied to the 8B model of gpu-1x.yaml
    x "$bin/ulysses-tune" plan --db "$db" --model llama-3.1-8b --hardware "$hardware" --world 1 \
      > "$dir/plan-llama-3.1-8b.txt"
  fi
  mv "$dir/plan.txt.tmp" "$dir/plan.txt"
}

stage_alst-run() {
  local so="" variant
  # Host syncs per step without Nsight Systems: CUDA runtime calls counted by an LD_PRELOAD
  # library, in two runs of 2 and 4 steps (their difference is two steady steps).
  if command -v cc > /dev/null && cc -O2 -shared -fPIC -o "$dir/sync_count.so" \
       "$campaign/sync_count.c" -ldl 2> "$dir/sync_count.build.log"; then
    so=$dir/sync_count.so
  fi
  for variant in both activations; do
    alst_config "$variant" "$dir/$variant.yaml" 4 "$dir/$variant"
    x "$bin/ulysses-train" --config "$dir/$variant.yaml" > "$dir/$variant.log" 2>&1 || return 1
    if [ -n "$so" ]; then
      for steps in 2 4; do
        x env LD_PRELOAD="$so" ULYSSES_SYNC_COUNT_OUT="$dir/$variant-syncs-$steps.json" \
          "$bin/ulysses-train" --config "$dir/$variant.yaml" --set train.steps=$steps \
          --set output.dir="$dir/$variant-syncs-$steps" > "$dir/$variant-syncs-$steps.log" 2>&1
      done
    fi
  done
  x "$python" "$campaign/findings.py" alst-run "$dir"
}

find_nsys() {
  if [ -n "${NSYS:-}" ]; then echo "$NSYS"; return; fi
  [ "$dry" = 1 ] && return  # the dry run uses only an nsys given by NSYS (a CPU run has no trace)
  local candidate
  for candidate in "$(command -v nsys 2> /dev/null)" "${CUDA_HOME:-/usr/local/cuda}/bin/nsys" \
      /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys; do
    [ -n "$candidate" ] && [ -x "$candidate" ] && { echo "$candidate"; return; }
  done
}

stage_profile() {
  local nsys
  nsys=$(find_nsys)
  [ -n "$nsys" ] || skip_stage "no Nsight Systems (set NSYS, or put nsys on PATH)"
  alst_config both "$dir/run.yaml" 4 "$dir/run-output"
  x "$bin/ulysses-tune" profile --db "$dir/profile.db" --config "$dir/run.yaml" --nsys "$nsys" \
    --out "$dir/nsys" || return 1
  x "$python" "$campaign/nsys_syncs.py" "$dir/nsys/profile.sqlite" --skip-steps 1 \
    --out "$dir/syncs.json"
}

stage_findings() {
  x "$python" "$campaign/findings.py" findings "$out"
}

# ---------------------------------------------------------------------------------------------
# The stage runner: status files, dependencies, retries of failed stages, the summary.

status_of() { sed -n 's/^status=//p' "$out/$1/status" 2> /dev/null; }

write_status() {  # STAGE STATUS EXIT SECONDS [REASON]
  printf 'status=%s\nexit=%s\nseconds=%s\nfinished=%s\nreason=%s\n' "$2" "$3" "$4" \
    "$(date -u +%FT%TZ)" "${5:-}" > "$out/$1/status"
}

summarize() { "$python" "$campaign/summary.py" "$out" > /dev/null || echo "gpu-campaign: summary failed" >&2; }

failed=0
run_stage() {
  local stage=$1 need reason="" start rc status
  if [ -e "$out/${RESULT[$stage]}" ] && [ "$(status_of "$stage")" = ok ]; then
    echo "== $stage: done earlier ($out/${RESULT[$stage]})"
    return
  fi
  for need in ${NEEDS[$stage]}; do
    [ "$(status_of "$need")" = ok ] || reason="needs $need, which has not succeeded"
  done
  if [ -d "$out/$stage" ]; then  # an earlier attempt: kept beside, the stage starts afresh
    local n=1
    while [ -e "$out/$stage.attempt-$n" ]; do n=$((n + 1)); done
    mv "$out/$stage" "$out/$stage.attempt-$n"
  fi
  mkdir -p "$out/$stage"
  if [ -n "$reason" ]; then
    echo "== $stage: skipped: $reason"
    write_status "$stage" skipped - 0 "$reason"
    return
  fi
  echo "== $stage"
  start=$SECONDS
  : > "$out/$stage/commands"
  (
    set +m  # what the stage starts stays in its process group
    cd "$root" || exit 1
    dir=$out/$stage
    export dir
    "stage_$stage"
  ) > "$out/$stage/log" 2>&1 &
  stage_pid=$!
  # The stage's time limit: past it the stage and everything it started are stopped.
  ( set +m; sleep "$stage_timeout" && kill -TERM -- "-$stage_pid" 2> /dev/null && sleep 10 &&
    kill -KILL -- "-$stage_pid" 2> /dev/null ) > /dev/null 2>&1 &
  local watchdog=$!
  wait "$stage_pid"
  rc=$?
  stage_pid=""
  kill -- "-$watchdog" 2> /dev/null
  wait "$watchdog" 2> /dev/null
  if [ "$rc" = 0 ] && [ -e "$out/${RESULT[$stage]}" ]; then
    status=ok
  elif [ "$rc" = 77 ]; then
    status=skipped reason=$(cat "$out/$stage/skip-reason" 2> /dev/null)
  else
    status=failed failed=1
    [ "$rc" = 0 ] && reason="no ${RESULT[$stage]}"
    [ $((SECONDS - start)) -ge "$stage_timeout" ] && reason="stopped after $stage_timeout s"
  fi
  write_status "$stage" "$status" "$rc" $((SECONDS - start)) "$reason"
  echo "   $status (exit $rc, $((SECONDS - start)) s)${reason:+: $reason}"
  [ "$status" = failed ] && tail -n 5 "$out/$stage/log" | sed 's/^/   | /'
  summarize
}

set -m  # each stage in its own process group, so its time limit stops all it started
stage_pid=""
# Interrupted: stop the running stage (its own process group does not get the terminal's signal).
trap '[ -n "$stage_pid" ] && kill -TERM -- "-$stage_pid" 2> /dev/null; exit 130' INT TERM
echo "gpu-campaign ($mode): $out"
for stage in "${STAGES[@]}"; do
  if [ -n "$only" ] && [[ ",$only," != *",$stage,"* ]]; then continue; fi
  run_stage "$stage"
done
summarize
echo "summary: $out/summary.md"
exit $failed
