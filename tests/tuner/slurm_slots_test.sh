#!/usr/bin/env bash
# Trial slots over a SLURM allocation of several nodes, on the local test cluster of three nodes
# (scripts/slurm-local.sh, ULYSSES_SLURM_NODES=3), with the fake trainer (tests/tuner/fake_trainer.sh;
# FAKE_LOG records where and when each trial ran):
#   1. a grid sweep of trials of `nodes: 1`, submitted with `--submit --slots 3`, is a job of 3
#      nodes and runs its trials on three slots, one node each: trials on different nodes at the
#      same time (the database's slot, started_at / finished_at and trial_neighbours; the fake
#      trainer's hosts and times);
#   2. the same sweep SIGKILLed while two trials run (they hang: FAKE_HANG_AT), then submitted
#      again with --resume: only those two run again, and the statuses equal 1.'s;
#   3. the same sweep with `slots: auto` in a batch job of 3 nodes (sbatch --nodes 3 --no-kill:
#      auto is one slot per node), n2 taken down while a trial runs on it (FAKE_HANG_ON=n2 holds
#      it there): the sweep says on stderr that the slot is out of use, runs the trial again on
#      n1 or n3, nothing more on n2, and finishes with 1.'s statuses.
# Usage: slurm_slots_test.sh BUILD_DIR. Exit 77 (ctest SKIP_RETURN_CODE) when the cluster cannot
# run here (not root, slurm-wlm / munge missing, network namespaces not permitted).
set -euo pipefail
build=$(cd "${1:?usage: slurm_slots_test.sh BUILD_DIR}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
tune=$build/bin/ulysses-tune
fake=$root/tests/tuner/fake_trainer.sh
python=${ULYSSES_PYTHON:-python3}
slurm_local=$root/scripts/slurm-local.sh
# Its own ports, names and subnet: the clusters of slurm_sweep and slurm_cluster may be up.
export ULYSSES_SLURM_NODES=3 ULYSSES_SLURM_CPUS=2 ULYSSES_SLURM_CTLD_PORT=16847
export ULYSSES_SLURM_SLURMD_PORT=16848 ULYSSES_SLURM_NET=ulst ULYSSES_SLURM_SUBNET=10.217.4
"$slurm_local" check || exit 77
slurm_dir=/tmp/ulysses-slurm-slots-test
work=$(mktemp -d /tmp/slurm-slots-test.XXXXXX)
cleanup() {  # stop ends every process on the nodes, the sweeps' jobs with them
  "$slurm_local" stop "$slurm_dir" || true
  if [ -n "${ULYSSES_KEEP_TEST_DIR:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
eval "$("$slurm_local" start "$slurm_dir")"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*" >&2; exit 1; }
job_gone() { [ -z "$(squeue --noheader --jobs="$1" 2> /dev/null)" ]; }
wait_job() {  # JOB SECONDS
  for _ in $(seq $(($2 * 2))); do job_gone "$1" && return 0; sleep 0.5; done
  fail "job $1 still running after $2 s"
}
query() {  # DB SQL -> rows as "a|b|c"
  "$python" - "$1" "$2" << 'PY'
import sqlite3, sys
for row in sqlite3.connect(sys.argv[1]).execute(sys.argv[2]):
    print("|".join("" if v is None else str(v) for v in row))
PY
}
count() { query "$1" "$2" 2> /dev/null || echo 0; }
# `sweep --submit` of sweep NAME (database NAME.db, log runs/NAME/sweep-<job>.log); prints the
# job id.
submit() {  # NAME [sweep options...]
  local name=$1
  shift
  "$tune" sweep "$work/slots.yaml" --name "$name" --db "$work/$name.db" --trainer "$fake" \
    --submit "$@" > "$work/$name.submit" || fail "submit $name: $(cat "$work/$name.submit")"
  local job
  job=$(sed -n 's/^submitted job \([0-9]*\):.*/\1/p' "$work/$name.submit")
  [ -n "$job" ] || fail "no job id: $(cat "$work/$name.submit")"
  echo "$job"
}
# Sweep NAME run by hand in a batch job of 3 nodes (log NAME-<job>.log); prints the job id.
# --no-kill: the job runs on when a node fails (SLURM cancels the whole job otherwise).
batch() {  # NAME
  sbatch --parsable --no-kill --nodes=3 --ntasks-per-node=2 --job-name="ulysses-slots-$1" \
    --output="$work/$1-%j.log" --wrap="exec $tune sweep $work/slots.yaml --name $1 \
      --db $work/$1.db --trainer $fake" || fail "sbatch of sweep $1"
}
statuses="SELECT key, status, exit_code FROM trials WHERE remeasure_of IS NULL ORDER BY key"

# Five trials of 2 ranks on one node each: 1024, 2048 and 4096 fit, 8192 and 16384 run out of the
# 1 GiB (the fake trainer's memory: 100 MiB + length / sp / 4).
cat > "$work/slots.yaml" << YAML
name: slots
hardware: cpu-local
world_size: 2
memory_limit_gib: 1.0
base:
  model: {hidden_size: 32, num_layers: 1, num_heads: 4, num_kv_heads: 2, intermediate_size: 64,
          vocab_size: 128}
  train: {device: cpu, steps: 5}
space: {mesh.sp: [2], sequence.length: [1024, 2048, 4096, 8192, 16384]}
objective: throughput
budget: {trial_timeout_s: 120}
search: {method: grid}
runner: srun
nodes: 1
slots: auto
YAML

# 1. Three slots, trials side by side.
job=$(FAKE_SLEEP=2 FAKE_LOG="$work/a.log" submit a --slots 3)
grep -q "^#SBATCH --nodes=3$" "$work/runs/a/sweep.sbatch" ||
  fail "sweep a's job does not hold 3 nodes: $(cat "$work/runs/a/sweep.sbatch")"
grep -q "^#SBATCH --no-kill$" "$work/runs/a/sweep.sbatch" ||
  fail "sweep a's job of 3 slots would end with a failed node: $(cat "$work/runs/a/sweep.sbatch")"
wait_job "$job" 180
log=$work/runs/a/sweep-$job.log
grep -q "sweep a finished" "$log" || fail "sweep a: $(tail -5 "$log")"
grep -q "3 slots" "$log" || fail "sweep a did not run 3 slots: $(head -3 "$log")"
query "$work/a.db" "$statuses" > "$work/a.rows"
[ "$(wc -l < "$work/a.rows")" = 5 ] || fail "sweep a: $(cat "$work/a.rows")"
[ "$(grep -c '|ok|0$' "$work/a.rows")" = 3 ] && [ "$(grep -c '|oom|12$' "$work/a.rows")" = 2 ] ||
  fail "sweep a's statuses: $(cat "$work/a.rows")"
slots=$(count "$work/a.db" "SELECT count(DISTINCT slot) FROM trials WHERE slot IS NOT NULL")
[ "$slots" -ge 2 ] || fail "sweep a's trials ran on $slots slots"
neighbours=$(count "$work/a.db" "SELECT count(*) FROM trial_neighbours")
[ "$neighbours" -ge 2 ] || fail "sweep a: no trials side by side in trial_neighbours"
overlap=$(count "$work/a.db" "SELECT count(*) FROM trials a JOIN trials b ON a.id < b.id
  WHERE a.slot != b.slot AND a.started_at <= b.finished_at AND b.started_at <= a.finished_at")
[ "$overlap" -ge 1 ] || fail "sweep a: no two trials of different slots overlap in time"
# Where the fake trainer ran: three hosts, and two trials on different hosts at the same time.
"$python" - "$work/a.log" << 'PY' || fail "sweep a's trials (fake trainer log): $(cat "$work/a.log")"
import sys
runs = {}
for line in open(sys.argv[1]):
    event, out, host, t = line.split()
    runs.setdefault(out, {})[event] = float(t)
    runs[out]["host"] = host
hosts = {r["host"] for r in runs.values()}
assert hosts == {"n1", "n2", "n3"}, hosts
# (A rank that runs out of memory may be stopped by SLURM before it logs its end.)
ended = [r for r in runs.values() if "start" in r and "end" in r]
pairs = [(a, b) for a in ended for b in ended
         if a["host"] < b["host"] and a["start"] < b["end"] and b["start"] < a["end"]]
assert pairs, runs
print(f"sweep a: {len(runs)} runs on {sorted(hosts)}, {len(pairs)} pairs on different nodes at once")
PY

# 2. SIGKILL while two trials run, then --resume.
job=$(FAKE_HANG_AT=1024,2048 FAKE_LOG="$work/b.log" submit b --slots 3)
hanging_started() {  # the two running trials' ranks started (a trial's run dir is runs/b/<id>)
  local out n=0
  for out in $(count "$work/b.db" "SELECT '$work/runs/b/' || id || '/out' FROM trials
                                   WHERE status = 'running'"); do
    grep -q "^start $out " "$work/b.log" 2> /dev/null && n=$((n + 1))
  done
  [ "$n" = 2 ]
}
for _ in $(seq 240); do  # the three others done, the two hanging ones started
  done_trials=$(count "$work/b.db" "SELECT count(*) FROM trials WHERE status != 'running'")
  [ "${done_trials:-0}" -ge 3 ] && hanging_started && break
  job_gone "$job" && fail "sweep b ended early: $(tail -3 "$work/runs/b/sweep-$job.log")"
  sleep 0.5
done
running=$(count "$work/b.db" "SELECT group_concat(seqlen) FROM (SELECT seqlen FROM trials
  WHERE status = 'running' ORDER BY seqlen)")
[ "$running" = "1024,2048" ] || fail "sweep b: running trials '$running', not 1024 and 2048"
pid=$(pgrep -f "^[^ ]*ulysses-tune sweep .*--db $work/b.db") || fail "no sweep b process"
kill -KILL "$pid"
wait_job "$job" 60
[ "$(query "$work/b.db" 'PRAGMA integrity_check')" = ok ] || fail "database b damaged"
: > "$work/b2.log"
job=$(FAKE_LOG="$work/b2.log" submit b --slots 3 --resume)
wait_job "$job" 180
log=$work/runs/b/sweep-$job.log
grep -q "(resumed)" "$log" || fail "sweep b did not resume: $(tail -3 "$log")"
grep -q "sweep b finished" "$log" || fail "resumed sweep b: $(tail -5 "$log")"
again=$(query "$work/b.db" "SELECT run_dir || '/out' FROM trials WHERE seqlen IN (1024, 2048)
  ORDER BY run_dir" | tr '\n' ' ')
rerun=$(awk '$1 == "start" { print $2 }' "$work/b2.log" | sort | tr '\n' ' ')
[ "$rerun" = "$again" ] || fail "resume ran '$rerun', not only the two interrupted trials '$again'"
query "$work/b.db" "$statuses" > "$work/b.rows"
diff "$work/a.rows" "$work/b.rows" || fail "sweep b after --resume differs from sweep a (above)"
echo "sweep b: SIGKILL with 1024 and 2048 running, --resume ran those two, same statuses"

# 3. n2 fails under a trial.
job=$(FAKE_HANG_ON=n2 FAKE_LOG="$work/c.log" batch c)
for _ in $(seq 240); do
  grep -q '^start .* n2 ' "$work/c.log" 2> /dev/null && break
  job_gone "$job" && fail "sweep c ended early: $(tail -3 "$work/c-$job.log")"
  sleep 0.5
done
grep -q '^start .* n2 ' "$work/c.log" || fail "no trial of sweep c started on n2"
"$slurm_local" node-down n2 "$slurm_dir"
down_at=$(date +%s.%N)
wait_job "$job" 240
log=$work/c-$job.log
grep -q "sweep c finished" "$log" || fail "sweep c after node-down n2: $(tail -5 "$log")"
grep -q "3 slots" "$log" || fail "slots auto is not 3 slots on 3 nodes: $(head -3 "$log")"
grep -E "slot .*n2.* taken out of use" "$log" || fail "no line says n2's slot is out of use: $(tail -5 "$log")"
# The trial that was on n2 ran again on another node, and the database says so.
n2_out=$(awk '$1 == "start" && $3 == "n2" { print $2; exit }' "$work/c.log")
awk -v out="$n2_out" '$1 == "end" && $2 == out && $3 != "n2"' "$work/c.log" | grep -q . ||
  fail "the trial of n2 ($n2_out) did not run again on n1 or n3: $(cat "$work/c.log")"
slot=$(query "$work/c.db" "SELECT slot FROM trials WHERE run_dir || '/out' = '$n2_out'")
case "$slot" in "nodes n1"|"nodes n3") ;; *) fail "the trial of n2 is stored on slot '$slot'" ;; esac
awk -v t="$down_at" '$1 == "start" && $3 == "n2" && $4 > t' "$work/c.log" | grep -q . &&
  fail "a trial started on n2 after it went down: $(cat "$work/c.log")"
query "$work/c.db" "$statuses" > "$work/c.rows"
diff "$work/a.rows" "$work/c.rows" || fail "sweep c differs from sweep a (above)"
echo "sweep c: n2 failed under a trial, its slot left, the sweep finished on n1 and n3"
echo "PASS"
