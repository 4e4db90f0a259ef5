#!/bin/sh
# A stand-in for ulysses-train in the sweep tests: reads the run config the tuner wrote, decides
# from a synthetic memory function whether it "runs out of memory" (exit 12, like the real one)
# and otherwise writes metrics.jsonl and summary.json (rank 0) with a synthetic throughput.
# memory (MiB) = 100 + length / sp / 4 x (0.5 if tiled_loss > 1) x (0.6 if offload_activations)
# against memory.limit_gib. FAKE_HANG_AT=<length> hangs at that length; FAKE_SLEEP=<s> delays
# every rank (to kill a sweep in the middle of a trial); FAKE_BACKEND=deepspeed plays the deepspeed
# backend's rank program (0.8 x the throughput, its own memory baseline, a workaround named).
# FAKE_TERM_AT=<n> FAKE_TERM_PID=<pid> FAKE_COUNT_DIR=<dir>: in the n-th trial started, one rank
# sends SIGTERM to <pid> (the sweep) and every rank waits to be stopped: the signal arrives
# during a trial after exactly n - 1 finished ones (trials are counted as directories in <dir>,
# made by whichever rank comes first: a rank may be stopped before it gets here).
# FAKE_HANG_AT may list several lengths (1024,2048); FAKE_HANG_ON=<host> hangs every trial that
# runs on that host (a node of the local test cluster). FAKE_LOG=<file>: rank 0 appends
# "start|end <output dir> <hostname> <epoch s>" when it starts and when it ends (where trials ran,
# and when). The rank is $RANK, else $SLURM_PROCID (a step of runner srun), else 0.
[ "$1" = --version ] && { echo "fake trainer"; exit 0; }
cfg=$2
# The six keys in one pass (a sweep test starts this script thousands of times): the value of
# `key:` under `section:`, as shell assignments.
eval "$(awk '/^[a-z]/ { s = $1 } s != $1 && $1 ~ /:$/ {
  k = s $1
  if (k == "sequence:length:") print "len=\047" $2 "\047"
  if (k == "mesh:sp:") print "sp=\047" $2 "\047"
  if (k == "memory:tiled_loss:") print "tl=\047" $2 "\047"
  if (k == "memory:offload_activations:") print "off=\047" $2 "\047"
  if (k == "memory:limit_gib:") print "limit=\047" $2 "\047"
  if (k == "output:dir:") print "out=\047" $2 "\047"
}' "$cfg")"
if [ -n "$FAKE_TERM_AT" ]; then
  trial=$(basename "$(dirname "$out")")
  mkdir "$FAKE_COUNT_DIR/$trial" 2>/dev/null && first=1 || first=0
  if [ "$(ls "$FAKE_COUNT_DIR" | wc -l)" -eq "$FAKE_TERM_AT" ]; then
    [ "$first" = 1 ] && kill -TERM "$FAKE_TERM_PID"
    exec sleep 300
  fi
fi
rank=${RANK:-${SLURM_PROCID:-0}}
log_event() {
  [ -n "$FAKE_LOG" ] && [ "$rank" = 0 ] && echo "$1 $out $(hostname) $(date +%s.%N)" >> "$FAKE_LOG"
  return 0
}
log_event start
[ -n "$FAKE_SLEEP" ] && sleep "$FAKE_SLEEP"
case ",$FAKE_HANG_AT," in *",$len,"*) [ -n "$len" ] && exec sleep 300 ;; esac
[ -n "$FAKE_HANG_ON" ] && [ "$(hostname)" = "$FAKE_HANG_ON" ] && exec sleep 300
eval "$(awk -v len="$len" -v sp="$sp" -v tl="$tl" -v off="$off" -v limit="$limit" 'BEGIN {
  mem = 100 + len / sp / 4 * (tl == "1" ? 1 : 0.5) * (off == "true" ? 0.6 : 1)
  tps = 10000 / (1 + 0.1 * (sp - 1)) * (tl == "1" ? 1 : 0.95) * (off == "true" ? 0.8 : 1)
  printf "mem=%d tps=%.1f oom=%d\n", mem, tps, (limit > 0 && mem > limit * 1024)
}')"
extra=""
if [ "$FAKE_BACKEND" = deepspeed ]; then
  tps=$(awk -v t="$tps" 'BEGIN { printf "%.1f", 0.8 * t }')
  extra=', "backend": "deepspeed", "memory_baseline_bytes": 52428800, "first_loss": 5.0,
 "workarounds": ["fake: loss scaled by 1 / sp"]'
fi
if [ "$oom" = 1 ]; then
  echo "out of memory: fake trainer needs $mem MiB at length $len" >&2
  log_event end
  exit 12
fi
if [ "$rank" = 0 ]; then
  mkdir -p "$out"
  bytes=$((mem * 1048576))
  : > "$out/metrics.jsonl"
  for step in 1 2 3; do
    echo "{\"step\": $step, \"loss\": 5.0, \"grad_norm\": 1.0, \"step_ms\": 100.0, \"tokens_per_s\": $tps, \"peak_mem_bytes\": $bytes, \"peak_host_bytes\": $bytes}" >> "$out/metrics.jsonl"
  done
  cat > "$out/summary.json" <<JSON
{"measured_steps": 2, "step_ms_median": 100.0, "tokens_per_s_median": $tps,
 "tokens_per_s_per_rank_median": $tps, "final_loss": 5.0, "peak_mem_bytes": $bytes,
 "peak_host_bytes": $bytes, "phases_ms_median": {"attention": 40.0, "a2a": 10.0},
 "compute_ms_median": 70.0, "comm_ms_median": 20.0, "offload_ms_median": 0.0,
 "optimizer_ms_median": 5.0$extra}
JSON
fi
log_event end
exit 0
