#!/usr/bin/env bash
# Installs what the build and the tests need, only what is missing (idempotent; a second run
# installs nothing):
#   - Debian 12 packages (apt-get): compiler, CMake, Ninja, Gloo headers, yaml-cpp, SQLite,
#     GoogleTest, Google Benchmark, CLI11, nlohmann-json, gnuplot (report plots);
#   - a project-local Python venv (.venv, ignored by git) holding PyTorch 2.13.0 (CPU build; its
#     LibTorch is what CMake builds against) and the real clients the tests check our outputs
#     with: transformers, DeepSpeed, arctic-training, Accelerate.
# Environment: ULYSSES_VENV (default <root>/.venv), ULYSSES_SKIP_PY=1 to skip the venv.
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
