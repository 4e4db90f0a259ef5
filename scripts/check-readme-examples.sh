#!/usr/bin/env bash
# Runs the README's example command lines as they are written and checks that each exits 0.
#
# Usage: scripts/check-readme-examples.sh [BUILD_DIR]      (default: build; ctest: readme_examples)
#
# Examples are the lines of README.md's indented code blocks that start with `ulysses-tune`,
# `ulysses-train`, `build/bin/`, `scripts/` or `torchrun` (the venv's, on PATH after our binaries). Each runs in order with `bash -c` in one scratch
# directory that looks like a checkout (experiments/ and profiles/ linked, build/bin linked, the
# binaries on PATH; runs/ and reports/ are fresh), so later examples see what earlier ones wrote
# (the sweep writes runs/q.db, which list/show/recommend/export/report read). A synopsis is
# turned into the plain command: `# comments` and optional `[...]` parts are dropped, and of
# alternatives `a|b` the first is kept. Lines matched by SKIP below are not run, with the reason.
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
)

# The example lines, one per line, as written.
examples() {
  awk '/^    [^ ]/ { sub(/^    /, ""); print }' "$readme" |
    grep -E '^(ulysses-tune|ulysses-train|build/bin/|scripts/|torchrun )'
}

# A synopsis as a plain command: no comment, no [optional] parts, first of a|b alternatives.
plain() {
  sed -E -e 's/[[:space:]]+#.*$//' -e 's/[[:space:]]*\[[^]]*\]//g' <<<"$1" |
    awk '{ for (i = 1; i <= NF; i++) { split($i, alt, "|"); $i = alt[1] } print }'
}

skip_reason() {
  local command=$1 entry
  for entry in "${SKIP[@]}"; do
    # shellcheck disable=SC2053  # the pattern is a glob on purpose
    if [[ $command == ${entry%%|*} ]]; then
      echo "${entry#*|}"
      return
    fi
  done
}

scratch=$(mktemp -d "${TMPDIR:-/tmp}/readme-examples-XXXXXX")
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/build" "$scratch/runs" "$scratch/reports"
ln -s "$root/experiments" "$scratch/experiments"
ln -s "$root/profiles" "$scratch/profiles"
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
  reason=$(skip_reason "$command")
  if [[ -n $reason ]]; then
    echo "SKIP  $line    ($reason)"
    skipped=$((skipped + 1))
    continue
  fi
  start=$SECONDS
  if output=$(cd "$scratch" && bash -c "$command" </dev/null 2>&1); then
    echo "ok    $command    ($((SECONDS - start)) s)"
    ran=$((ran + 1))
  else
    status=$?
    echo "FAIL  $command    (exit $status)"
    tail -n 15 <<<"$output" | sed 's/^/      /'
    failed=$((failed + 1))
  fi
done
echo "check-readme-examples: $ran ran, $skipped skipped, $failed failed"
[[ $failed -eq 0 ]]
