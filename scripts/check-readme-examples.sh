#!/usr/bin/env bash
# Runs the README's example command lines as they are written and checks that each exits 0.
#
# Usage: scripts/check-readme-examples.sh [BUILD_DIR]      (default: build; ctest: readme_examples)
#
# Examples are the lines of README.md's indented code blocks that start with `ulysses-tune`,
# `ulysses-train`, `build/bin/`, `scripts/`, `bench/` or `torchrun` (the venv's, on PATH after our
# binaries). Each runs in order with `bash -c` in one scratch directory that looks like a checkout
# (experiments/, profiles/, scripts/ and bench/ linked, build/bin linked, the binaries and the
# venv's python3 on PATH; runs/ and reports/ are fresh), so later examples see what earlier ones
# wrote (the sweep writes runs/q.db, which list/show/recommend/export/report read). A synopsis is
# turned into the plain command: `# comments` and optional `[...]` parts are dropped, and of
# alternatives `a|b` the first is kept. Lines matched by SKIP below are not run, with the reason;
# nor are lines whose comment starts with "GPU" or "SLURM" (they need a GPU or a SLURM cluster).
# Lines matched by SMALLER run on a smaller input (a small experiment), and say so.
# Then every experiments/, scripts/ and bench/ path the README names must exist (renamed files).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
readme="${README_FILE:-$root/README.md}"  # README_FILE: another file, to test this script

# pattern (bash glob on the plain command) | why it is not run here
SKIP=(
  "scripts/quickstart.sh*|the whole quickstart (build, sweep, recommend, report, launch): minutes; its steps run one by one below"
  "scripts/test.sh*|builds and runs the whole test suite, this check included"
  "*--submit*|submits to a SLURM cluster (sbatch); the slurm_sweep test runs it against a local SLURM"
  "*sbatch *|needs a SLURM cluster"
  "scripts/fetch-deps.sh*|downloads Debian packages (apt-get download)"
  "scripts/build-gpu.sh|configures and builds the project (minutes); its --print form runs"
  "scripts/gpu-campaign.sh*--dry-run*|a few minutes: the gpu_campaign_dry_run_all and gpu_quick_dry_run tests run it"
  "scripts/make-wheel-bundle.sh*|downloads wheels from the package index and builds DeepSpeed's"
  "bench/compare/compare.py run*--dry-run*|about two minutes: the bench_compare test runs it"
)
# pattern (bash glob on the plain command) | text in it | what it becomes here | why
SMALLER=(
  "ulysses-tune sweep experiments/quickstart-cpu.yaml*|experiments/quickstart-cpu.yaml|$root/tests/docs/readme-sweep.yaml|the whole sweep takes minutes: the same model, world and limit over 4 trials give the commands after it a sweep to read (scripts/quickstart.sh runs it whole)"
)
# Paths the README may name that are not files of the project (a user's own experiment).
NOT_FILES=(experiments/my-cluster.yaml experiments/X.yaml)

# The example lines, one per line, as written.
examples() {
  awk '/^    [^ ]/ { sub(/^    /, ""); print }' "$readme" |
    grep -E '^(ulysses-tune|ulysses-train|build/bin/|scripts/|bench/|torchrun )'
}

# A synopsis as a plain command: no comment, no [optional] parts, first of a|b alternatives.
plain() {
  sed -E -e 's/[[:space:]]+#.*$//' -e 's/[[:space:]]*\[[^]]*\]//g' <<<"$1" |
    awk '{ for (i = 1; i <= NF; i++) { split($i, alt, "|"); $i = alt[1] } print }'
}

skip_reason() {  # COMMAND LINE: the reason not to run it, or nothing
  local command=$1 line=$2 entry
  if [[ $line =~ \#[[:space:]]*(GPU|SLURM) ]]; then
    echo "needs a ${BASH_REMATCH[1]/SLURM/SLURM cluster} (its comment says so)"
    return
  fi
  for entry in "${SKIP[@]}"; do
    # shellcheck disable=SC2053  # the pattern is a glob on purpose
    if [[ $command == ${entry%%|*} ]]; then
      echo "${entry#*|}"
      return
    fi
  done
}

smaller() {  # COMMAND: the command as it runs here (SMALLER), or nothing
  local command=$1 entry rest from to
  for entry in "${SMALLER[@]}"; do
    # shellcheck disable=SC2053  # the pattern is a glob on purpose
    if [[ $command == ${entry%%|*} ]]; then
      rest=${entry#*|}; from=${rest%%|*}; rest=${rest#*|}; to=${rest%%|*}
      echo "${command/"$from"/"$to"}"
      return
    fi
  done
}

scratch=$(mktemp -d "${TMPDIR:-/tmp}/readme-examples-XXXXXX")
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/build" "$scratch/runs" "$scratch/reports"
ln -s "$root/experiments" "$scratch/experiments"
ln -s "$root/profiles" "$scratch/profiles"
ln -s "$root/scripts" "$scratch/scripts"
ln -s "$root/bench" "$scratch/bench"
ln -s "$build/bin" "$scratch/build/bin"
export PATH="$build/bin:$root/.venv/bin:$PATH" ULYSSES_HOME="$root"

mapfile -t lines < <(examples)
if [[ ${#lines[@]} -eq 0 ]]; then
  echo "check-readme-examples: no example lines found in $readme" >&2
  exit 1
fi
ran=0 skipped=0 failed=0
for line in "${lines[@]}"; do
  command=$(plain "$line")
  reason=$(skip_reason "$command" "$line")
  if [[ -n $reason ]]; then
    echo "SKIP  $line    ($reason)"
    skipped=$((skipped + 1))
    continue
  fi
  small=$(smaller "$command")
  start=$SECONDS
  if output=$(cd "$scratch" && bash -c "${small:-$command}" </dev/null 2>&1); then
    echo "ok    $command    ($((SECONDS - start)) s${small:+; run here as: $small})"
    ran=$((ran + 1))
  else
    status=$?
    echo "FAIL  $command    (exit $status)"
    tail -n 15 <<<"$output" | sed 's/^/      /'
    failed=$((failed + 1))
  fi
done
# Every experiments/, scripts/ and bench/ path named anywhere in the README exists.
missing=0
while read -r path; do
  for other in "${NOT_FILES[@]}"; do [[ $path == "$other" ]] && continue 2; done
  if [[ ! -e $root/$path ]]; then
    echo "FAIL  README names $path, which does not exist"
    missing=$((missing + 1))
  fi
done < <(grep -oE '(experiments|scripts|bench)/[A-Za-z0-9_./-]*[A-Za-z0-9_/]' "$readme" | sort -u)
failed=$((failed + missing))
echo "check-readme-examples: $ran ran, $skipped skipped, $failed failed"
[[ $failed -eq 0 ]]
