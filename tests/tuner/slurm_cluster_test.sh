#!/usr/bin/env bash
# The local test cluster of several nodes (scripts/slurm-local.sh with ULYSSES_SLURM_NODES=3):
#   1. three nodes come up idle, and `srun -N3 hostname` runs one task on each: n1, n2, n3;
#   2. the real trainer runs inside a node's namespaces: 2 ranks on n2 (MASTER_ADDR n2, its own
#      address) and 2 ranks across n2 and n3 (the ranks reach each other over the bridge) end with
#      the same loss;
#   3. node-down n2 while one step of an allocation runs on each node: the step on n2 fails with
#      srun's "Node failure on n2", n2 is DOWN, the job (--no-kill) keeps running on n1 and n3
#      with their steps, and no new step of that job goes to n2;
#   4. node-up n2: back in service, `srun -N3 hostname` reaches all three again;
#   5. stop removes the daemons, namespaces and bridge, and a second stop is harmless.
# Usage: slurm_cluster_test.sh BUILD_DIR. Exit 77 (ctest SKIP_RETURN_CODE) when the cluster cannot
# run here (not root, slurm-wlm / munge missing, network namespaces not permitted).
set -euo pipefail
build=$(cd "${1:?usage: slurm_cluster_test.sh BUILD_DIR}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
slurm_local=$root/scripts/slurm-local.sh
# Its own ports, names and subnet: the single-node cluster of slurm_sweep may be up.
export ULYSSES_SLURM_NODES=3 ULYSSES_SLURM_CPUS=2 ULYSSES_SLURM_CTLD_PORT=16837
export ULYSSES_SLURM_SLURMD_PORT=16838 ULYSSES_SLURM_NET=ulct ULYSSES_SLURM_SUBNET=10.217.3
"$slurm_local" check || exit 77
slurm_dir=/tmp/ulysses-slurm-cluster-test
work=$(mktemp -d /tmp/slurm-cluster-test.XXXXXX)
cleanup() {  # stop ends every process on the nodes, the test's job with them
  "$slurm_local" stop "$slurm_dir" || true
  if [ -n "${ULYSSES_KEEP_TEST_DIR:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
eval "$("$slurm_local" start "$slurm_dir")"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*" >&2; exit 1; }
state() { sinfo --noheader --nodes="$1" --format=%t; }
hosts() { timeout 60 srun --nodes=3 --ntasks-per-node=1 hostname | sort | tr '\n' ' '; }

# 1. Three nodes, one task on each.
for node in n1 n2 n3; do [ "$(state "$node")" = idle ] || fail "$node is $(state "$node")"; done
[ "$(hosts)" = "n1 n2 n3 " ] || fail "srun -N3 hostname: $(hosts)"
echo "3 nodes up: $(hosts)"

# 2. The trainer in a node's namespaces: on one node, and across two.
if [ -x "$build/bin/ulysses-train" ]; then
  for run in one two; do
    cat > "$work/$run.yaml" << YAML
model: {preset: tiny}
mesh: {sp: 2, dp: 1}
sequence: {length: 64}
train: {steps: 2, device: cpu}
profile: {warmup_steps: 1}
output: {dir: $work/$run}
YAML
  done
  MASTER_ADDR=n2 MASTER_PORT=29651 timeout 120 srun --nodes=1 --ntasks=2 --nodelist=n2 \
    "$build/bin/ulysses-train" --config "$work/one.yaml" > "$work/one.log" 2>&1 ||
    fail "2 ranks on n2: $(tail -3 "$work/one.log")"
  MASTER_ADDR=n2 MASTER_PORT=29652 timeout 120 srun --nodes=2 --ntasks-per-node=1 \
    --nodelist=n2,n3 "$build/bin/ulysses-train" --config "$work/two.yaml" > "$work/two.log" 2>&1 ||
    fail "2 ranks on n2 and n3: $(tail -3 "$work/two.log")"
  loss() { sed -n 's/.*"final_loss": *\([-0-9.e]*\).*/\1/p' "$work/$1/summary.json"; }
  [ -n "$(loss one)" ] || fail "no final loss in $work/one/summary.json"
  [ "$(loss one)" = "$(loss two)" ] || fail "final loss on one node $(loss one), on two $(loss two)"
  echo "trainer: 2 ranks on n2 and 2 ranks on n2 + n3 end at loss $(loss one)"
fi

# 3. A node fails under a running step.
cat > "$work/steps.sh" << EOF
#!/usr/bin/env bash
for node in n1 n2 n3; do
  ( srun --nodes=1 --ntasks=2 --nodelist=\$node sh -c 'echo started; exec sleep 120' \
      > "$work/\$node.out" 2> "$work/\$node.err"
    echo \$? > "$work/\$node.rc" ) &
done
wait
EOF
job=$(sbatch --parsable --no-kill --job-name=ulysses-cluster-test --nodes=3 --ntasks-per-node=2 \
        --output="$work/job.log" "$work/steps.sh")
for _ in $(seq 120); do  # every task started
  n=$(cat "$work"/n[123].out 2> /dev/null | grep -c started || true)
  [ "$n" = 6 ] && break
  sleep 0.5
done
[ "$n" = 6 ] || fail "the job's steps did not start: $(squeue --steps 2>&1; cat "$work/job.log")"
"$slurm_local" node-down n2 "$slurm_dir"
for _ in $(seq 120); do [ -f "$work/n2.rc" ] && break; sleep 0.5; done
[ -f "$work/n2.rc" ] || fail "the step on n2 still runs 60 s after the node went down"
grep -q "Node failure on n2" "$work/n2.err" || fail "step on n2: $(cat "$work/n2.err")"
case "$(state n2)" in down*) ;; *) fail "n2 is $(state n2) after node-down" ;; esac
[ ! -f "$work/n1.rc" ] && [ ! -f "$work/n3.rc" ] ||
  fail "a step on n1 or n3 ended with n2: $(cat "$work"/n[13].err)"
[ "$(squeue --noheader --jobs="$job" --format=%T)" = RUNNING ] || fail "job $job ended with n2"
if srun --jobid="$job" --overlap --nodes=1 --ntasks=1 --nodelist=n2 true 2> "$work/n2-again.err"; then
  fail "a new step of job $job ran on the failed node n2"
fi
echo "node-down n2: its step failed (srun exit $(cat "$work/n2.rc"): $(head -1 "$work/n2.err")), n2 $(state n2), n1 and n3 run on"
scancel "$job"

# 4. The node comes back.
"$slurm_local" node-up n2 "$slurm_dir"
[ "$(state n2)" = idle ] || fail "n2 is $(state n2) after node-up"
for _ in $(seq 60); do [ "$(hosts)" = "n1 n2 n3 " ] && break; sleep 0.5; done
[ "$(hosts)" = "n1 n2 n3 " ] || fail "after node-up: $(hosts)"

# 5. Everything goes, twice.
"$slurm_local" stop "$slurm_dir"
"$slurm_local" stop "$slurm_dir"
ip netns list | grep -q '^ulct-' && fail "namespaces left: $(ip netns list)"
ip link show ulct-br > /dev/null 2>&1 && fail "bridge ulct-br left"
pgrep -f "$slurm_dir/" > /dev/null && fail "daemons left: $(pgrep -af "$slurm_dir/")"
echo "PASS"
