#!/usr/bin/env bash
# The quick GPU campaign: a new node measured in one command under one deadline (default 540 s,
# the build included), into an OUT of at most 8 files that can be copied off the node in one go.
# Run it as `scripts/gpu-campaign.sh --quick OUT`; see --help.
#
# Usage: scripts/gpu-campaign.sh --quick OUT [--dry-run] [--budget S] [--build-dir DIR]
#                                [--deps PREFIX] [--python PY] [--wheels DIR]
#   OUT            new, empty, or an OUT of an earlier quick run (its files are replaced)
#   --dry-run      the same stages on CPU with tiny shapes: shows that everything works and what
#                  OUT looks like before a GPU minute is spent; its numbers measure nothing
#   --budget S     the whole run's wall-clock limit in seconds (default 540)
#   --build-dir    the build to use or make (default: build)
#   --deps PREFIX  the libraries' prefix for the build (scripts/fetch-deps.sh --from on a node
#                  without a package registry)
#   --python PY    the Python with PyTorch and transformers (default: $PYTHON; else, with --dry-run, the project's .venv where it exists; else python3)
#   --wheels DIR   Python wheels made beforehand (scripts/make-wheel-bundle.sh): those whose
#                  package PY lacks are installed into a private directory of this run, on
#                  PYTHONPATH for every stage; with DeepSpeed among them the comparison adds
#                  ds-zero3 and the deepspeed stage runs
#
# Stages, in order of value; each gets the time that is left (up to its own cap), and one that
# cannot have its minimum is skipped with a line saying so; a stage still running at the deadline
# is stopped and recorded as cut, with what it wrote so far:
#   build      scripts/build-gpu.sh: the three programs, the CUDA unit tests and kernels_bench,
#              one ninja run
#   unit       the CUDA unit tests (VarlenFlash, SdpSelection, FusedKernelsCuda), then
#              bench/kernels (the fused kernels against ATen, one JSON line per op and pass)
#   smoke      scripts/gpu-smoke.sh, the runs that fit: each SDPA kernel, ALST features, packed
#   multirank  the multi-rank paths against their single-process runs (scripts/campaign/
#              multirank.py: ring 2 x 2 on packed documents, uneven heads straddling GQA groups,
#              ZeRO-0 and ZeRO-3 with the optimizer offloaded): NCCL with a GPU per rank, else
#              Gloo with several ranks on one GPU (23 s of runs on one H200)
#   compare    bench/compare: ulysses-train vs transformers at 8K and 32K, one repeat
#              (ours-tiled, hf, ours-alst, ours-plain, hf-nockpt; ds-zero3 with DeepSpeed)
#   sweep      ulysses-tune sweep of experiments/gpu-quick.yaml (Llama-3.2-1B at 8K and 64K,
#              tiled loss on or off, no offload or both offloads: 8 trials; on an 80 GB GPU the
#              untiled loss runs out of memory at 64K by design), then list, recommend, report
#              and plan --fit on its trials
#   maxlen     the longest length ours (ALST) and transformers train, with what time is left
#              (on one H100/H200 little is: the full campaign's compare-maxlen-* stages search it)
#   deepspeed  the sweep's configurations at 8K with the DeepSpeed backend (needs DeepSpeed;
#              with what time is left)
# OUT: summary.md (what ran, what was skipped and why, the headline ratios),
# smoke.tsv, compare.md, sweep-trials.txt, recommended.yaml, plan-fit.txt and campaign.tgz
# (everything the stages wrote, without model weights and data).
# Exit status: 0 when no stage failed (skipped and cut stages are not failures), 1 when one
# failed, 2 bad usage or an OUT this script did not make.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
campaign=$root/scripts/campaign
# shellcheck source=common.sh
source "$campaign/common.sh"
STAGES=(build unit smoke multirank compare sweep maxlen deepspeed)
MARKER=.ulysses-quick

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
out="" dry=0 budget=540 build="" deps="" python="" wheels=""
while [ $# -gt 0 ]; do
  case $1 in
    --quick) shift ;;
    --dry-run) dry=1; shift ;;
    --budget) budget=${2:?--budget S}; shift 2 ;;
    --build-dir) build=${2:?--build-dir DIR}; shift 2 ;;
    --deps) deps=${2:?--deps PREFIX}; shift 2 ;;
    --python) python=${2:?--python PY}; shift 2 ;;
    --wheels) wheels=${2:?--wheels DIR}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "gpu-campaign --quick: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [ -z "$out" ] || { echo "gpu-campaign --quick: one OUT only" >&2; exit 2; }; out=$1; shift ;;
  esac
done
[ -n "$out" ] || { echo "usage: scripts/gpu-campaign.sh --quick OUT [--dry-run] [--budget S] (see --help)" >&2; exit 2; }
[[ $budget =~ ^[0-9]+$ ]] && [ "$budget" -ge 30 ] ||
  { echo "gpu-campaign --quick: --budget: '$budget' is not a whole number of seconds >= 30" >&2; exit 2; }
if [ -n "$wheels" ] && [ ! -d "$wheels" ]; then
  echo "gpu-campaign --quick: --wheels: no directory $wheels" >&2; exit 2
fi
if [ -e "$out" ] && [ ! -d "$out" ]; then echo "gpu-campaign --quick: $out is not a directory" >&2; exit 2; fi
if [ -d "$out" ] && [ -n "$(ls -A "$out")" ] && [ ! -f "$out/$MARKER" ]; then
  echo "gpu-campaign --quick: $out is not empty and was not made by this script (no $MARKER); choose a new OUT" >&2
  exit 2
fi
resolve_python "gpu-campaign --quick" "$python" "$dry" "$root" || exit 2
build=${build:-$root/build}
case $build in /*) ;; *) build=$PWD/$build ;; esac
bin=$build/bin

cores=$(getconf _NPROCESSORS_ONLN)
t0=$(date +%s)
deadline=$((t0 + budget))
reserve=12  # seconds kept for the summary and the tarball
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
printf 'made by scripts/gpu-campaign.sh --quick\n' > "$out/$MARKER"
work=$(mktemp -d "${TMPDIR:-/tmp}/ulysses-quick.XXXXXX") || exit 2

if [ "$dry" = 1 ]; then
  mode=dry-run device=cpu dtype=fp32 hardware=cpu-local model=tiny gpu=""
  compare_model=$DRY_COMPARE_MODEL
  compare_lengths=256 maxlen=(--start 1024 --max-length 2048 --limit-gib 0.1 --granule 1024)
  smoke_env=(SMOKE_DEVICE=cpu SMOKE_STEPS=3)
  export OMP_NUM_THREADS=1
  #          build unit smoke multirank compare sweep maxlen deepspeed
  MIN=(      1     1    5     10        20      20    20     20)
else
  mode=gpu device=cuda dtype=bf16 model=llama-3.2-1b
  detect_gpu
  compare_model=$model compare_lengths=8192,32768
  maxlen=(--start 32768 --max-length 524288 --granule 8192)
  smoke_env=(SMOKE_STEPS=5)
  MIN=(      60    10   20    30        60      60    60     60)
fi
# Caps sized from one H200 (16 cores), measured: build 107-137 s, unit 1 s, smoke 16-18 s, the
# seven multi-rank runs 23 s (run by hand, not yet as this stage), eight of the ten comparison
# runs 180 s (the 32K ALST run is the longest), the sweep's 12 trials 169 s. Estimated from
# those: the ten comparison runs within 250 s, leaving the 8-trial sweep 105-135 s (8K trials
# ~6 s, 64K ~22 s, then recommend, report and plan --fit); maxlen and deepspeed run only with
# what is left. The unit stage's FusedKernelsCuda tests and kernels_bench are not measured yet
# (estimated: under 20 s together; 90 shapes up to 8192 x 8192 with fp64 references).
CAP=(        0     40   30    60        250     0     0      0)   # 0: all that is left
# Where a stage skipped for time is run in full (said in summary.md).
declare -A ELSEWHERE=([maxlen]="scripts/gpu-campaign.sh runs it: compare-maxlen-ours, compare-maxlen-theirs")
cat > "$work/campaign.json" << EOF
{"mode": "$mode", "device": "$device", "dtype": "$dtype", "hardware": "$hardware",
 "model": "$model", "gpu": "${gpu:-}", "budget_s": $budget, "started": $t0,
 "host": "$(uname -m), $cores cores"}
EOF

# ---------------------------------------------------------------------------------------------
# Stages (run inside a stage: $dir is WORK/<stage>, $stage_s its seconds, cwd the project root).

has_deepspeed() { [ "$dry" = 0 ] && "$python" -c 'import deepspeed' > /dev/null 2>&1; }

stage_build() {
  local targets=(--target ulysses_train --target ulysses_tune --target ulysses_bench
                 --target kernels_bench)
  if [ "$dry" = 1 ]; then  # builds nothing: shows the commands, checks the existing binaries
    x "$root/scripts/build-gpu.sh" --python "$python" ${deps:+--deps "$deps"} --tests \
      "${targets[@]}" --target model_unit_tests --print "$build" || return 1
  elif ! x env JOBS="$cores" "$root/scripts/build-gpu.sh" --python "$python" \
         ${deps:+--deps "$deps"} --tests "${targets[@]}" --target model_unit_tests "$build"; then
    if grep -q "GTest" "$build/configure.log" 2> /dev/null; then
      echo "no GoogleTest: the programs without the unit tests"  # (scripts/fetch-deps.sh --tests)
      x env JOBS="$cores" "$root/scripts/build-gpu.sh" --python "$python" \
        ${deps:+--deps "$deps"} "${targets[@]}" "$build" || return 1
    else
      # The fused kernels are the one part built with nvcc: without them the programs keep the
      # ATen ops, so that a kernel that does not compile here costs the campaign only its own
      # test and timings (the log above keeps nvcc's errors).
      echo "the build failed: again without the fused CUDA kernels"
      x env JOBS="$cores" "$root/scripts/build-gpu.sh" --python "$python" \
        ${deps:+--deps "$deps"} --no-fused-kernels --tests "${targets[@]}" \
        --target model_unit_tests "$build" || return 1
    fi
  fi
  if [ "$dry" = 0 ]; then
    x nvidia-smi > "$dir/nvidia-smi.txt" 2>&1
  fi
  "$python" -c 'import sys, torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"device", torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "python",
sys.version.split()[0])' > "$dir/torch.txt" 2>&1
  "$python" -m pip list --format=freeze > "$dir/python-packages.txt" 2> /dev/null ||
    "$python" -c 'import importlib.metadata as m
print("\n".join(sorted(f"{d.metadata[\"Name\"]}=={d.version}" for d in m.distributions())))' \
      > "$dir/python-packages.txt"
  x "$bin/ulysses-train" --version > "$dir/version.txt" || return 1
  cat "$dir/version.txt"
  if [ "$dry" = 0 ] && ! grep -q "cuda yes" "$dir/version.txt"; then
    echo "this build has no CUDA: $(grep backends "$dir/version.txt")"
    return 1
  fi
}

stage_unit() {
  local tests
  tests=$(find "$build" -name model_unit_tests -type f -perm -u+x 2> /dev/null | head -n1)
  [ -n "$tests" ] || skip_stage "no model_unit_tests in $build (the build had no GoogleTest)"
  local rc=0
  x "$tests" --gtest_filter='VarlenFlash.*:SdpSelection.*:FusedKernelsCuda.*' \
    --gtest_output="xml:$dir/unit.xml" || rc=1
  # The fused kernels' timings (a CPU build has none to time).
  if [ "$dry" = 0 ]; then
    x "$bin/kernels_bench" > "$dir/kernels-bench.jsonl" || rc=1
    cat "$dir/kernels-bench.jsonl"
  fi
  return $rc
}

stage_smoke() {
  # The runs that matter on a GPU (gpu-smoke.sh's order), each started only while 10 s of the
  # stage are left.
  x env "${smoke_env[@]}" SMOKE_DEADLINE=$(($(date +%s) + stage_s - 10)) \
    SMOKE_ONLY=bf16_auto,bf16_alst,bf16_flash,bf16_efficient,bf16_cudnn,bf16_packed_16k,bf16_packed_16k_per_document,gloo_2ranks_sp2,fp32_auto \
    "$root/scripts/gpu-smoke.sh" "$build" "$dir"
}

compare() {  # compare OPTIONS...: bench/compare on one model, made once in WORK/compare-data
  x "$python" "$root/bench/compare/compare.py" run --out "$dir/bench" --data "$work/compare-data" \
    --device "$device" --dtype "$dtype" --model "$compare_model" --hardware "$hardware" \
    --bin "$bin" --python "$python" "$@"
}

stage_compare() {
  # In order of value: the tiled and ALST modes against transformers first, at each length.
  local configs=ours-tiled,hf,ours-alst,ours-plain,hf-nockpt
  if has_deepspeed; then
    # DeepSpeed compiles its ops on first use: once here, not inside a run's timeout.
    x timeout -s TERM $((stage_s / 2)) "$python" "$root/tuner/backends/deepspeed/ds_ops.py" \
      prepare --device cuda --result "$dir/ds-ops.json" --log "$dir/ds-ops.log" &&
      configs+=,ds-zero3
  fi
  compare --parts throughput --lengths "$compare_lengths" --reps 1 --warmup 1 --steps 3 \
    --configs "$configs" --timeout $((stage_s < 150 ? stage_s : 150))
}

sweep_experiment() {  # FILE [BACKEND]: the quick experiment of this mode
  x "$python" "$campaign/sweep_experiment.py" --quick --mode "$mode" --hardware "$hardware" \
    --model "$model" --out "$1" ${2:+--backend "$2"} "$root/experiments/gpu-quick.yaml"
}

stage_sweep() {
  local db=$dir/results.db sweep=quick-$mode-grid
  sweep_experiment "$dir/experiment.yaml" || return 1
  # New trials start until 40 s before the stage ends; a trial still running 25 s before is
  # stopped (the sweep records it), leaving the rest for recommend, report and plan --fit.
  x timeout -s TERM -k 5 $((stage_s - 25)) "$bin/ulysses-tune" sweep "$dir/experiment.yaml" \
    --db "$db" --wall-clock-s $((stage_s - 40))
  x "$bin/ulysses-tune" list --db "$db" --sweep "$sweep" > "$dir/trials.txt" || return 1
  x "$bin/ulysses-tune" recommend --db "$db" --sweep "$sweep" --out "$dir/recommended"
  x "$bin/ulysses-tune" plan --fit "$db" --out "$dir/fit.json" > "$dir/fit.txt"
  x "$bin/ulysses-tune" report --db "$db" --sweep "$sweep" --out "$dir/report"
  [ -s "$dir/trials.txt" ]
}

stage_multirank() {
  x "$python" "$campaign/multirank.py" --bin "$bin" --out "$dir" --device "$device"
}

stage_maxlen() {
  local configs=ours-alst,hf
  compare --parts maxlen --maxlen-configs "$configs" --configs "$configs" "${maxlen[@]}" \
    --budget-s $(((stage_s - 20) / 2)) --probe-timeout $((stage_s < 240 ? stage_s / 2 : 120))
}

stage_deepspeed() {
  [ "$dry" = 0 ] || skip_stage "the dry run leaves DeepSpeed out (its CPU ops take minutes to build)"
  has_deepspeed || skip_stage "$python cannot import deepspeed (see --wheels)"
  local db=$dir/results.db
  sweep_experiment "$dir/experiment.yaml" deepspeed || return 1
  x timeout -s TERM -k 5 $((stage_s - 15)) "$bin/ulysses-tune" sweep "$dir/experiment.yaml" \
    --db "$db" --python "$python" --wall-clock-s $((stage_s - 30))
  x "$bin/ulysses-tune" list --db "$db" --sweep "quick-$mode-deepspeed-grid" > "$dir/trials.txt"
}

# ---------------------------------------------------------------------------------------------
# The runner: one deadline, each stage timed out at what is left of it.

left() { echo $((deadline - reserve - $(date +%s))); }

write_status() {  # STAGE STATUS EXIT SECONDS [REASON]
  mkdir -p "$work/$1"
  printf 'status=%s\nexit=%s\nseconds=%s\nreason=%s\n' "$2" "$3" "$4" "${5:-}" > "$work/$1/status"
}

failed=0 stage_pid=""
run_stage() {  # STAGE INDEX
  local stage=$1 i=$2 have stage_s start rc status reason=""
  have=$(left)
  stage_s=$have
  [ "${CAP[$i]}" -gt 0 ] && [ "${CAP[$i]}" -lt "$stage_s" ] && stage_s=${CAP[$i]}
  if [ "$have" -lt "${MIN[$i]}" ]; then
    reason="$((have < 0 ? 0 : have)) s left, needs ${MIN[$i]}${ELSEWHERE[$stage]:+ (${ELSEWHERE[$stage]})}"
    write_status "$stage" skipped - 0 "$reason"
    echo "== $stage: skipped: $reason"
    return
  fi
  mkdir -p "$work/$stage"
  : > "$work/$stage/commands"
  echo "== $stage (up to $stage_s s; $have s left)"
  start=$(date +%s)
  (
    set +m  # what the stage starts stays in its process group
    cd "$root" || exit 1
    dir=$work/$stage
    export dir stage_s
    if [ "${GPU_CAMPAIGN_STALL:-}" = "$stage" ]; then  # for this script's tests: a stage that hangs
      x sleep 100000
    else
      "stage_$stage"
    fi
  ) > "$work/$stage/log" 2>&1 &
  stage_pid=$!
  ( set +m; sleep "$stage_s" && kill -TERM -- "-$stage_pid" 2> /dev/null && sleep 5 &&
    kill -KILL -- "-$stage_pid" 2> /dev/null ) > /dev/null 2>&1 &
  local watchdog=$!
  wait "$stage_pid"
  rc=$?
  stage_pid=""
  kill -- "-$watchdog" 2> /dev/null
  wait "$watchdog" 2> /dev/null
  local took=$(($(date +%s) - start))
  if [ "$took" -ge "$stage_s" ]; then
    status=cut
    if [ "$stage_s" -lt "$have" ]; then reason="stopped at its cap of $stage_s s"
    else reason="stopped at the deadline after $took s"; fi
  elif [ "$rc" = 0 ]; then
    status=ok
  elif [ "$rc" = 77 ]; then
    status=skipped reason=$(cat "$work/$stage/skip-reason" 2> /dev/null)
  else
    status=failed failed=1 reason="exit $rc: $(grep -v '^\s*$' "$work/$stage/log" | tail -n1 | cut -c1-200)"
  fi
  write_status "$stage" "$status" "$rc" "$took" "$reason"
  echo "   $status (exit $rc, $took s)${reason:+: $reason}"
}

finish() {
  "$python" "$campaign/quick_report.py" "$work" "$out" --elapsed $(($(date +%s) - t0)) ||
    echo "gpu-campaign --quick: the summary failed (everything is in $work)" >&2
  [ -f "$out/campaign.tgz" ] && rm -rf "$work"
  echo "summary: $out/summary.md ($(($(date +%s) - t0)) s)"
}

install_wheels() {
  local target=$work/campaign-python
  mkdir -p "$work/setup"
  echo "== wheels from $wheels"
  if "$python" "$campaign/install_wheels.py" "$wheels" "$target" > "$work/setup/wheels.txt" 2>&1; then
    export PYTHONPATH=$target${PYTHONPATH:+:$PYTHONPATH}
  fi
  sed 's/^/   /' "$work/setup/wheels.txt"
}

set -m  # each stage in its own process group, so its time limit stops all it started
trap 'echo "gpu-campaign --quick: interrupted"; [ -n "$stage_pid" ] && kill -TERM -- "-$stage_pid" 2> /dev/null;
      sleep 1; finish; exit 130' INT TERM
echo "gpu-campaign --quick ($mode, $budget s): $out"
[ -n "$wheels" ] && install_wheels
for i in "${!STAGES[@]}"; do
  stage=${STAGES[$i]}
  if [ "$stage" != build ] && ! grep -qx "status=ok" "$work/build/status" 2> /dev/null; then
    write_status "$stage" skipped - 0 "needs build, which has not succeeded"
    echo "== $stage: skipped: needs build"
    continue
  fi
  run_stage "$stage" "$i"
done
finish
exit $failed
