#!/usr/bin/env bash
# scripts/gpu-campaign.sh --dry-run end to end on CPU, so the GPU campaign is known to work before
# a GPU minute is spent:
#   1. the dry run (Nsight Systems replaced by tests/tuner/fake_nsys.sh, whose trace has known
#      counts): every stage ok, every result file present, summary.md in the GPU run's layout,
#      the trace's host syncs and copy times counted as the fixture says. By default the stages
#      this campaign alone has (build, smoke, alst-run, profile, findings), the others listed as
#      not run: the comparison and the sweep run the same tools as the quick campaign's stages,
#      whose dry run (gpu_quick_test.sh) runs them, and bench/compare's own test runs every part
#      of the comparison. --all: every stage (a few minutes);
#   2. a second invocation skips every stage (resumable) and succeeds;
#   3. a failed stage is recorded with its command and exit status, the stages that need it are
#      skipped, the others run, and the campaign exits 1;
#   4. an OUT it did not make (non-empty, no marker) is refused and left untouched; so is a
#      campaign directory of the other mode;
#   5. scripts/campaign/findings.py's verdicts on CUDA-shaped inputs (what a GPU run would feed it).
# Usage: gpu_campaign_test.sh BUILD_DIR [--all]   (ULYSSES_PYTHON: a Python with torch and
#        transformers)
set -euo pipefail
build=$(cd "${1:?usage: gpu_campaign_test.sh BUILD_DIR [--all]}" && pwd)
all=0
[ "${2:-}" = --all ] && all=1
root=$(cd "$(dirname "$0")/../.." && pwd)
python=${ULYSSES_PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-campaign-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
campaign() { "$root/scripts/gpu-campaign.sh" "$@" --dry-run --build-dir "$build" --python "$python"; }
export NSYS=$root/tests/tuner/fake_nsys.sh FAKE_NSYS_PYTHON=$python OMP_NUM_THREADS=1

# 1. The dry run.
out=$work/out
every=(build smoke compare-throughput compare-maxlen-ours compare-maxlen-theirs sweep plan-fit
       alst-run profile findings)
if [ "$all" = 1 ]; then
  stages=("${every[@]}") selected=()
  files=(compare-throughput/bench/results.jsonl compare-maxlen-ours/bench/summary.md
         compare-maxlen-theirs/bench/summary.md sweep/report/README.md
         sweep/recommended/recommended.yaml plan-fit/plan.txt)
else
  stages=(build smoke alst-run profile findings) files=()
  selected=(--stages "$(IFS=,; echo "${stages[*]}")")
fi
campaign "$out" "${selected[@]}" > "$work/run1.log" 2>&1 ||
  { cat "$work/run1.log"; fail "dry run exited $?"; }
for stage in "${stages[@]}"; do
  grep -qx "status=ok" "$out/$stage/status" ||
    { cat "$work/run1.log"; fail "stage $stage: $(cat "$out/$stage/status")"; }
done
for f in "${files[@]}" build/version.txt smoke/gpu-smoke.tsv alst-run/alst-run.json \
    profile/syncs.json findings/findings.md findings/findings.json .ulysses-campaign summary.md; do
  [ -e "$out/$f" ] || fail "no $f"
done
summary=$out/summary.md
previous=0
for heading in "## Stages" "## Smoke" "## Comparison with transformers" "## One-GPU sweep" \
    "## Cost model fitted on the sweep" "## GPU findings" "## Commands"; do
  line=$(grep -n -x -F "$heading" "$summary" | cut -d: -f1)
  [ -n "$line" ] && [ "$line" -gt "$previous" ] || fail "summary.md: '$heading' missing or out of order"
  previous=$line
done
for stage in "${every[@]}"; do
  if [[ " ${stages[*]} " == *" $stage "* ]]; then
    grep -q "^| $stage | ok | 0 |" "$summary" || fail "summary.md: no ok row for $stage"
    grep -qx "### $stage" "$summary" || fail "summary.md: no commands of $stage"
  else
    grep -q "^| $stage | not run |" "$summary" || fail "summary.md: $stage not listed as not run"
  fi
done
grep -q "scripts/gpu-smoke.sh" "$summary" && grep -q "^  exit 0$" "$summary" ||
  fail "summary.md: commands without their exit status"
grep -q "| Host syncs per step |" "$summary" && grep -q "| Peak reserved vs allocated |" "$summary" &&
  grep -q "| Offload copy time per step |" "$summary" || fail "summary.md: a findings row is missing"
"$python" - "$out" "$all" << 'EOF' || fail "the trace's counts"
import json, sys
s = json.load(open(sys.argv[1] + "/profile/syncs.json"))
assert s["steps"] == 2, s
assert s["host_syncs_per_step"] == 3 and s["d2h_copy_calls_per_step"] == 1, s
assert s["copies_per_step"]["d2h"]["ms"] == 4 and s["copies_per_step"]["h2d"]["ms"] == 3, s
run = json.load(open(sys.argv[1] + "/alst-run/alst-run.json"))["variants"]
for v in ("both", "activations"):  # a CPU build makes no CUDA call
    assert run[v]["syncs"]["host_syncs_per_step"] == 0, run[v]
    assert run[v]["memory"]["offload_optimizer"] == (v == "both"), run[v]["memory"]
if sys.argv[2] == "1":
    records = [json.loads(l) for l in open(sys.argv[1] + "/compare-throughput/bench/results.jsonl")]
    assert [r["config"] for r in records if r["kind"] == "run"][:4] == ["ours-alst", "hf"] * 2
EOF
echo "1. dry run ok ($(grep -c '' "$summary") lines of summary)"

# 2. Resumed: every stage is done, nothing runs again.
campaign "$out" "${selected[@]}" > "$work/run2.log" 2>&1 ||
  { cat "$work/run2.log"; fail "second invocation exited $?"; }
[ "$(grep -c ': done earlier' "$work/run2.log")" -eq ${#stages[@]} ] ||
  { cat "$work/run2.log"; fail "second invocation re-ran a stage"; }
echo "2. resumed ok"

# 3. A failed stage: build fails (no binaries there), smoke needs it, profile does not.
set +e
NSYS="" "$root/scripts/gpu-campaign.sh" "$work/failing" --dry-run --build-dir "$work/no-build" \
  --python "$python" --stages build,smoke,plan-fit,findings > "$work/run3.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 1 ] || { cat "$work/run3.log"; fail "a failed stage: exit $rc, not 1"; }
grep -qx "status=failed" "$work/failing/build/status" || fail "build not recorded as failed"
grep -q "^reason=needs build" "$work/failing/smoke/status" || fail "smoke not skipped for build"
grep -q "^| build | failed | 1 |" "$work/failing/summary.md" || fail "summary: no failed build row"
grep -q "scripts/build-gpu.sh" "$work/failing/summary.md" || fail "summary: the failed command"
echo "3. failed stage recorded ok"

# 4. Directories it did not make.
mkdir "$work/theirs" && echo keep > "$work/theirs/file"
set +e
campaign "$work/theirs" > "$work/run4.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] && [ "$(ls -A "$work/theirs")" = file ] && [ "$(wc -l < "$work/run4.log")" -eq 1 ] ||
  { cat "$work/run4.log"; fail "a foreign OUT: exit $rc or touched"; }
set +e
"$root/scripts/gpu-campaign.sh" "$out" --build-dir "$build" --python "$python" > "$work/run5.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "another mode" "$work/run5.log" || fail "a dry-run OUT reused for a GPU run"
echo "4. foreign OUT refused ok"

# 5. The verdicts on CUDA-shaped inputs.
gpu=$work/gpu && mkdir -p "$gpu/alst-run/both" "$gpu/alst-run/activations" "$gpu/profile"
"$python" - "$gpu" << 'EOF'
import json, sys
gpu = sys.argv[1]
def summary(step_ms, reserved):
    return {"device": "cuda:0", "sequence_length": 32768, "step_ms_median": step_ms,
            "offload_ms_median": 50.0, "optimizer_ms_median": 100.0,
            "max_rank_peak_allocated_bytes": 10 << 30, "max_rank_peak_reserved_bytes": reserved,
            "max_rank_outside_allocator_bytes": 1 << 29, "attention_kernels": ["flash"]}
json.dump(summary(3000.0, 12 << 30), open(gpu + "/alst-run/both/summary.json", "w"))
json.dump(summary(1000.0, 10 << 30), open(gpu + "/alst-run/activations/summary.json", "w"))
names = ["cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
         "cudaMemcpyAsync_d2h_pageable", "cudaMemcpyAsync_d2h_pinned", "cudaMemcpyAsync_h2d",
         "cudaMemcpyAsync_default"]
for variant, per_step in (("both", 40), ("activations", 1)):
    for steps in (2, 4):
        counts = dict.fromkeys(names, 0)
        counts["cudaStreamSynchronize"] = 7 + per_step * steps
        counts["cudaMemcpyAsync_d2h_pageable"] = per_step * steps if variant == "both" else 0
        json.dump(counts, open(f"{gpu}/alst-run/{variant}-syncs-{steps}.json", "w"))
EOF
"$python" "$root/scripts/campaign/findings.py" alst-run "$gpu/alst-run" > /dev/null
"$python" "$root/scripts/campaign/findings.py" findings "$gpu" > /dev/null
"$python" - "$gpu" << 'EOF' || fail "findings verdicts on CUDA inputs"
import json, sys
rows = {r["check"]: r for r in json.load(open(sys.argv[1] + "/findings/findings.json"))["rows"]}
assert rows["Offload copy time per step"]["verdict"] == "confirmed", rows
assert rows["Offload copy time per step"]["d2h_pageable_per_step"] == 40, rows
assert rows["Peak reserved vs allocated"]["verdict"] == "confirmed", rows  # +25 % over allocated
assert rows["Host syncs per step"]["verdict"] == "confirmed", rows  # 40 per step
assert rows["Attention kernels"]["verdict"].startswith("refuted"), rows
assert "both: 40 per step" in rows["Host syncs per step"]["measured"], rows
EOF
echo "5. findings verdicts ok"
echo "gpu_campaign: all checks passed"
