#!/usr/bin/env bash
# runner: srun against a real SLURM: starts a private single-node SLURM on this machine
# (scripts/slurm-local.sh), then
#   1. a hanging trial (fake trainer) submitted with `sweep --submit` is killed by its step's time
#      limit and classified `timeout` (runs while 2. runs: it sleeps);
#   2. the quickstart sweep (its model, base and limit; grid over points whose status does not
#      depend on the run: sp 4 at 4096 tokens, with activation offload and without, fits with the
#      tiled loss far below the limit (50.3 of 67.6 MB in each of 32 local runs) and runs out of
#      memory without it; sp 2's tiled point at that length peaked between 50.3 and 61.1 MB in
#      identical runs and once went out of memory, and the full smart search's boundary trials flip
#      between runs) with runner local;
#   3. the same sweep submitted with `--submit --runner srun`, `scancel`ed after a few trials (the
#      database stays intact, the sweep `interrupted`, or still `running` when SLURM's SIGKILL
#      came before the sweep could record it; --resume takes either), then resubmitted with `--resume`;
#   4. both sweeps compared: the same trials with the same statuses (oom included) and, for every
#      fitting trial, the same final loss.
# Usage: slurm_sweep_test.sh BUILD_DIR. Exit 77 (ctest SKIP_RETURN_CODE) when SLURM cannot run here
# (not root, slurm-wlm / munge missing), with the reason on stderr.
set -euo pipefail
build=$(cd "${1:?usage: slurm_sweep_test.sh BUILD_DIR}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
tune=$build/bin/ulysses-tune
python=${ULYSSES_PYTHON:-python3}
"$root/scripts/slurm-local.sh" check || exit 77
export ULYSSES_SLURM_CPUS=6  # the quickstart's 4 ranks and the hanging trial's 2 at once
slurm_dir=/tmp/ulysses-slurm-test
work=$(mktemp -d /tmp/slurm-sweep-test.XXXXXX)
cleanup() {
  scancel --quiet --name=ulysses-sweep-q 2> /dev/null || true
  scancel --quiet --name=ulysses-sweep-hang 2> /dev/null || true
  "$root/scripts/slurm-local.sh" stop "$slurm_dir" || true
  if [ -n "${ULYSSES_KEEP_TEST_DIR:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
eval "$("$root/scripts/slurm-local.sh" start "$slurm_dir")"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*" >&2; exit 1; }
job_gone() { [ -z "$(squeue --noheader --jobs="$1" 2> /dev/null)" ]; }
wait_job() {  # JOB SECONDS
  for _ in $(seq $(($2 * 2))); do job_gone "$1" && return 0; sleep 0.5; done
  fail "job $1 still running after $2 s"
}
job_of() { sed -n 's/^submitted job \([0-9]*\):.*/\1/p' "$1"; }
query() {  # DB SQL -> rows as "a|b|c"
  "$python" - "$1" "$2" << 'PY'
import sqlite3, sys
for row in sqlite3.connect(sys.argv[1]).execute(sys.argv[2]):
    print("|".join("" if v is None else str(v) for v in row))
PY
}

# 1. A trial that hangs: SLURM's step time limit (1 min) ends it -> timeout.
cat > "$work/hang.yaml" << YAML
name: hang
hardware: cpu-local
world_size: 2
memory_limit_gib: 1.0
base:
  model: {hidden_size: 32, num_layers: 1, num_heads: 4, num_kv_heads: 2, intermediate_size: 64,
          vocab_size: 128}
  train: {device: cpu, steps: 5}
space: {mesh.sp: [2], sequence.length: [512, 1024]}
objective: throughput
budget: {trial_timeout_s: 20}
search: {method: grid}
runner: srun
YAML
FAKE_HANG_AT=1024 "$tune" sweep "$work/hang.yaml" --db "$work/hang.db" \
  --trainer "$root/tests/tuner/fake_trainer.sh" --submit > "$work/hang.submit"
hang_job=$(job_of "$work/hang.submit")
[ -n "$hang_job" ] || fail "no job id: $(cat "$work/hang.submit")"

# 2. The quickstart sweep, local ranks.
awk '/^space:/ { skip = 1; next } skip && /^$/ { skip = 0; next } !skip' \
  "$root/experiments/quickstart-cpu.yaml" | sed 's/^search: .*/search: {method: grid}/' > "$work/q.yaml"
cat >> "$work/q.yaml" << YAML
space:
  mesh.sp: [4]
  memory.tiled_loss: [1, 8]
  memory.offload: [none, activations]
  sequence.length: [4096]
YAML
"$tune" sweep "$work/q.yaml" --name q --db "$work/local.db" --runs-dir "$work/local-runs" \
  > "$work/local.log" 2>&1 ||
  fail "local sweep: $(tail -3 "$work/local.log")"

# 3. The same through SLURM: submit, scancel after 2 stored trials, resubmit with --resume.
"$tune" sweep "$work/q.yaml" --name q --db "$work/srun.db" --runner srun --submit > "$work/srun.submit"
job=$(job_of "$work/srun.submit")
[ -n "$job" ] || fail "no job id: $(cat "$work/srun.submit")"
grep -q "database: $work/srun.db" "$work/srun.submit" || fail "no database line"
for _ in $(seq 600); do
  done_trials=$(query "$work/srun.db" "SELECT count(*) FROM trials WHERE status != 'running'" \
                2> /dev/null || echo 0)
  [ "${done_trials:-0}" -ge 2 ] && break
  job_gone "$job" && fail "sweep job $job ended early: $(tail -3 "$work"/runs/*/sweep-"$job".log)"
  sleep 0.5
done
scancel "$job"
wait_job "$job" 60
[ "$(query "$work/srun.db" 'PRAGMA integrity_check')" = ok ] || fail "database damaged"
status=$(query "$work/srun.db" "SELECT status FROM sweeps WHERE name = 'q'")
[ "$status" = interrupted ] || [ "$status" = running ] || fail "sweep status after scancel: $status"
stopped=$(query "$work/srun.db" "SELECT count(*) FROM trials")
echo "scancel after $stopped trials: sweep $status, database intact"
"$tune" sweep "$work/q.yaml" --name q --db "$work/srun.db" --runner srun --submit --resume \
  > "$work/resume.submit"
resume_job=$(job_of "$work/resume.submit")
wait_job "$resume_job" 300
log="$work/runs/q/sweep-$resume_job.log"
grep -q "(resumed)" "$log" || fail "resume job did not resume: $(tail -3 "$log")"
grep -q "sweep q finished" "$log" || fail "resumed sweep: $(tail -3 "$log")"

# 4. Same trials, statuses and losses.
rows="SELECT key, status, exit_code, printf('%.12g', final_loss) FROM trials
      WHERE sweep_id = (SELECT id FROM sweeps WHERE name = 'q') ORDER BY key"
query "$work/local.db" "$rows" > "$work/local.rows"
query "$work/srun.db" "$rows" > "$work/srun.rows"
diff "$work/local.rows" "$work/srun.rows" || fail "runner srun differs from runner local (above)"
grep -q '|oom|12|' "$work/srun.rows" || fail "no oom trial in the quickstart sweep"
echo "quickstart: $(wc -l < "$work/srun.rows") trials, same statuses and losses through srun"

# 1, checked: the hanging trial ended by SLURM's limit, the other one ok.
wait_job "$hang_job" 200
hang=$(query "$work/hang.db" "SELECT seqlen, status, exit_code, error FROM trials ORDER BY seqlen")
echo "$hang"
echo "$hang" | grep -q '^512|ok|0|' || fail "the 512 trial is not ok"
echo "$hang" | grep -q '^1024|timeout|124|step time limit of 1 min reached (SLURM)' ||
  fail "the hanging trial is not a SLURM time-limit timeout"
echo "PASS"
