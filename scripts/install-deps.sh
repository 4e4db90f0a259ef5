#!/usr/bin/env bash
# Installs what the build and the tests need, only what is missing (idempotent; a second run
# installs nothing):
#   - Debian 12 packages (apt-get): compiler, CMake, Ninja, Gloo headers, yaml-cpp, SQLite,
#     GoogleTest, Google Benchmark, CLI11, nlohmann-json, gnuplot (report plots);
#   - a project-local Python venv (.venv, ignored by git) holding PyTorch 2.13.0 (CPU build; its
#     LibTorch is what CMake builds against) and the real clients the tests check our outputs
#     with: transformers, DeepSpeed, arctic-training, Accelerate;
#   - DeepSpeed's CPU ops (shared-memory collectives, FusedAdam, CPUAdam), built once into torch's
#     extensions directory by tuner/backends/deepspeed/ds_ops.py (minutes on 2 cores the first time,
#     a few seconds to check afterwards), so that no test or sweep trial compiles them inside its
#     own time limit. A lock left by a killed build is reported in one line, not waited on.
# Environment: ULYSSES_VENV (default <root>/.venv), ULYSSES_SKIP_PY=1 to skip the venv,
# ULYSSES_SKIP_DS_OPS=1 to skip DeepSpeed's ops (scripts/quickstart.sh, which does not run DeepSpeed).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

pkgs=(build-essential cmake ninja-build pkg-config libgloo-dev libyaml-cpp-dev
      libsqlite3-dev sqlite3 libgtest-dev libgmock-dev googletest libbenchmark-dev libcli11-dev
      nlohmann-json3-dev gnuplot-nox python3 python3-venv)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -ne 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "installing Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

[ "${ULYSSES_SKIP_PY:-0}" = 1 ] && exit 0
venv=${ULYSSES_VENV:-$root/.venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
# The requirement file pins torch to the CPU build: an unpinned torch pulls a CUDA build of
# several GB. Packages that build against torch (DeepSpeed ships as source) are installed with
# --no-build-isolation after torch, so their build uses this torch instead of downloading one.
stamp="$venv/.ulysses-requirements"
wanted=$(cat "$root"/scripts/requirements.txt "$root"/scripts/requirements-nobuild.txt \
             "$root"/scripts/requirements-arctic.txt)
if [ "$wanted" != "$(cat "$stamp" 2>/dev/null)" ]; then
  "$py" -m pip install -q --disable-pip-version-check -r "$root/scripts/requirements.txt"
  DS_BUILD_OPS=0 "$py" -m pip install -q --disable-pip-version-check --no-build-isolation \
    -r "$root/scripts/requirements-nobuild.txt"
  # arctic-training's full dependency set pulls training extras (flash-attn, liger, wandb, ...);
  # its config code needs only what requirements.txt lists for it, so it goes in without deps.
  "$py" -m pip install -q --disable-pip-version-check --no-deps -r "$root/scripts/requirements-arctic.txt"
  printf '%s' "$wanted" > "$stamp"
fi

# DeepSpeed's CPU ops. ds_ops.py prepare builds what is missing (or only loads what is built) and
# reports a stale build lock instead of waiting on it forever.
[ "${ULYSSES_SKIP_DS_OPS:-0}" = 1 ] && exit 0
ops_dir=$(mktemp -d "${TMPDIR:-/tmp}/ulysses-ds-ops.XXXXXX")
set +e
OMP_NUM_THREADS=1 "$py" "$root/tuner/backends/deepspeed/ds_ops.py" prepare --device cpu \
  --result "$ops_dir/result.json" --log "$ops_dir/build.log"
rc=$?
set -e
if [ "$rc" -ne 0 ]; then
  message=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["message"])' \
              "$ops_dir/result.json" 2> /dev/null || echo "exit status $rc")
  echo "install-deps: DeepSpeed's CPU ops: $message (build log: $ops_dir/build.log)" >&2
  exit "$rc"
fi
rm -rf "$ops_dir"
