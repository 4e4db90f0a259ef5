#!/usr/bin/env bash
# scripts/gpu-campaign.sh --quick --dry-run end to end on CPU, so the quick GPU campaign is known to
# work before a GPU minute is spent:
#   1. a dry run with a wheel bundle: every stage ok (DeepSpeed skipped with its reason), OUT made
#      of at most 8 plain files (the marker included) of at most 16 MiB, summary.md with the
#      headline (ratios, sweep of >= 8 finished trials with an out-of-memory one, the
#      recommendation, plan --fit's error on the sweep's trials, the multi-rank runs' peaks beside
#      the cost model's), the bundle's missing package
#      installed privately and seen by the stages, the one the Python has left out, the tarball
#      holding every stage without the model weights;
#   2. the deadline: with the unit stage hanging and a 40 s budget (less than that stage's own cap
#      is left after the build), it is stopped at the deadline and recorded as cut, every later
#      stage is skipped with the seconds it lacked, the run ends within the budget (plus the
#      summary's few seconds) and exits 0; OUT (the first run's) is replaced whole: the files this
#      run has nothing for are gone;
#   3. a non-empty OUT it did not make is refused with one line and left untouched; so is a Python
#      that cannot import torch, before OUT is made.
# Usage: gpu_quick_test.sh BUILD_DIR   (ULYSSES_PYTHON: a Python with torch and transformers)
set -euo pipefail
build=$(cd "${1:?usage: gpu_quick_test.sh BUILD_DIR}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
python=${ULYSSES_PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-quick-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
quick() { "$root/scripts/gpu-campaign.sh" --quick "$@" --dry-run --build-dir "$build" --python "$python"; }
export OMP_NUM_THREADS=1

out_rules() {  # OUT: at most 8 entries, all plain files of at most 16 MiB
  local n
  n=$(find "$1" -mindepth 1 | wc -l)
  [ "$n" -le 8 ] || fail "$1 holds $n entries: $(ls -A "$1")"
  [ -z "$(find "$1" -mindepth 1 ! -type f)" ] || fail "$1 holds a folder or a link"
  [ -z "$(find "$1" -type f -size +16M)" ] || fail "$1 holds a file over 16 MiB"
}

# A wheel bundle: one package this Python lacks, one it has (packaging).
"$python" - "$work/wheels" << 'PY'
import base64, hashlib, os, sys, zipfile
out = sys.argv[1]
os.makedirs(out)
def wheel(name, version, files):
    info = f"{name}-{version}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},{len(text.encode())}\n"
        for path, text in files.items()) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record
    with zipfile.ZipFile(os.path.join(out, f"{name}-{version}-py3-none-any.whl"), "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
wheel("ulysses_quick_probe", "1.0", {"ulysses_quick_probe/__init__.py": "VALUE = 42\n"})
wheel("packaging", "0.0.1", {"packaging/__init__.py": "raise ImportError('the bundle copy')\n"})
PY

# 1. The dry run.
out=$work/out
start=$(date +%s)
quick "$out" --wheels "$work/wheels" > "$work/run1.log" 2>&1 ||
  { cat "$work/run1.log"; fail "dry run exited $?"; }
echo "1. dry run: $(($(date +%s) - start)) s"
out_rules "$out"
for f in summary.md smoke.tsv compare.md sweep-trials.txt recommended.yaml plan-fit.txt \
    campaign.tgz .ulysses-quick; do
  [ -s "$out/$f" ] || fail "no $f in OUT"
done
summary=$out/summary.md
for stage in build unit smoke multirank compare sweep maxlen; do
  grep -q "^| $stage | ok | " "$summary" || { cat "$summary"; fail "summary.md: $stage not ok"; }
done
grep -q "^| deepspeed | skipped | 0 | the dry run leaves DeepSpeed out" "$summary" ||
  fail "summary.md: no reason for the skipped deepspeed stage"
previous=0
for heading in "## Headline" "## Stages" "## Comparison with transformers" "## Files"; do
  line=$(grep -n -x -F "$heading" "$summary" | cut -d: -f1)
  [ -n "$line" ] && [ "$line" -gt "$previous" ] || fail "summary.md: '$heading' missing or out of order"
  previous=$line
done
"$python" - "$summary" << 'PY' || { cat "$summary"; fail "summary.md's headline"; }
import re, sys
text = open(sys.argv[1]).read()
head = text.split("## Headline", 1)[1].split("## Stages", 1)[0]
assert re.search(r"256 tokens, tiled MLP \+ loss vs checkpointing: ours [0-9.]+x transformers' tokens/s", head), head
m = re.search(r"Sweep: (\d+) trials finished \(([^)]*)\)", head)
assert m and int(m.group(1)) >= 8 and re.search(r"\b[1-9]\d* oom\b", m.group(2)), head
assert re.search(r"Recommended: trial #\d+: memory\.tiled_loss=\w+, memory\.offload=\w+ at \d+ tokens", head), head
assert re.search(r"plan --fit's error on the sweep's own trials: time worst [0-9.]+ %, RMS [0-9.]+ %; memory worst", head), head
assert re.search(r"Longest length hf trains: \d+", head), head
assert re.search(r"Multi-rank paths \(gloo, fp32\): 4 of 4 within 1e-05 of their reference runs' losses", head), head
assert "## Multi-rank paths" in text and "| ring 2 x 2 (sp 4) on packed documents vs sp 1 | ring1 | ok |" in text, text
# each run's measured peak beside the cost model's prediction for its config, and the reference's
assert re.search(r"\| ring 2 x 2 \(sp 4\) on packed documents vs sp 1 \| ring1 \| ok \| [0-9.e+-]+ "
                 r"\| \d+ \| \d+ \| \d+ \| \d+ \|", text), text
assert "ulysses_quick_probe" not in head
wheels = re.search(r"^Wheels: (.*)$", text, re.M).group(1)
assert "ulysses-quick-probe 1.0: installed" in wheels, wheels
assert re.search(r"packaging: this Python has [0-9.]+ \(the bundle's 0.0.1 left out\)", wheels), wheels
PY
grep -q "^| 256 | ours-tiled / hf " "$out/compare.md" || fail "compare.md: no ratio row"
mkdir "$work/unpacked"
tar xzf "$out/campaign.tgz" -C "$work/unpacked"
for f in campaign/sweep/results.db campaign/sweep/report/README.md campaign/compare/commands \
    campaign/compare/bench/results.jsonl campaign/maxlen/bench/results.jsonl \
    campaign/smoke/gpu-smoke.tsv campaign/unit/unit.xml campaign/summary.md campaign/MANIFEST.txt; do
  [ -e "$work/unpacked/$f" ] || fail "campaign.tgz: no $f"
done
[ ! -e "$work/unpacked/campaign/compare-data" ] && [ ! -e "$work/unpacked/campaign/campaign-python" ] ||
  fail "campaign.tgz holds the model data or the private wheels"
grep -qi "^ulysses.quick.probe==1.0" "$work/unpacked/campaign/build/python-packages.txt" ||
  fail "the stages did not see the privately installed wheel"
! grep -rq "ulysses-quick\." "$out/plan-fit.txt" "$out/sweep-trials.txt" ||
  fail "OUT names the deleted working directory"
echo "1. dry run ok"

# 2. The deadline, into the first run's OUT.
start=$(date +%s)
GPU_CAMPAIGN_STALL=unit quick "$out" --budget 40 > "$work/run2.log" 2>&1 ||
  { cat "$work/run2.log"; fail "the deadline run exited $?"; }
took=$(($(date +%s) - start))
[ "$took" -le 65 ] || { cat "$work/run2.log"; fail "the 40 s run took $took s"; }
out_rules "$out"
grep -q "^| unit | cut | [0-9]* | stopped at the deadline after [0-9]* s |" "$out/summary.md" ||
  { cat "$out/summary.md"; fail "unit not recorded as cut at the deadline"; }
for stage in smoke multirank compare sweep maxlen deepspeed; do
  grep -qE "^\| $stage \| skipped \| 0 \| [0-9]+ s left, needs [0-9]+( \([^|]*\))? \|" "$out/summary.md" ||
    { cat "$out/summary.md"; fail "$stage not skipped for time"; }
done
grep -qE "^\| maxlen \| skipped \| 0 \| [0-9]+ s left, needs [0-9]+ \(scripts/gpu-campaign.sh runs it: compare-maxlen-ours, compare-maxlen-theirs\) \|" "$out/summary.md" ||
  { cat "$out/summary.md"; fail "maxlen skipped without where it runs in full"; }
for f in smoke.tsv compare.md sweep-trials.txt recommended.yaml plan-fit.txt; do
  [ ! -e "$out/$f" ] || fail "$f of the first run left beside the second's summary"
done
[ -s "$out/campaign.tgz" ] && [ -s "$out/summary.md" ] || fail "the cut run's OUT is incomplete"
echo "2. deadline ok ($took s)"

# 3. A directory it did not make.
mkdir "$work/theirs" && echo keep > "$work/theirs/file"
set +e
quick "$work/theirs" > "$work/run3.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] && [ "$(ls -A "$work/theirs")" = file ] && [ "$(wc -l < "$work/run3.log")" -eq 1 ] ||
  { cat "$work/run3.log"; fail "a foreign OUT: exit $rc or touched"; }
# A Python without torch (as a system python3 often is) is refused in one line before OUT is made.
printf '#!/bin/sh\nexit 1\n' > "$work/no-torch-python" && chmod +x "$work/no-torch-python"
set +e
"$root/scripts/gpu-campaign.sh" --quick "$work/no-torch" --dry-run --build-dir "$build" \
  --python "$work/no-torch-python" > "$work/run4.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] && [ ! -e "$work/no-torch" ] && [ "$(wc -l < "$work/run4.log")" -eq 1 ] &&
  grep -q "cannot import torch" "$work/run4.log" ||
  { cat "$work/run4.log"; fail "a Python without torch: exit $rc, or OUT made"; }
echo "3. foreign OUT and a Python without torch refused ok"
echo "gpu_quick: all checks passed"
