#!/usr/bin/env bash
# Installs the Debian 12 packages the build needs, only those missing (idempotent).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config libtorch-dev libgloo-dev libyaml-cpp-dev
      libsqlite3-dev sqlite3 libgtest-dev libgmock-dev googletest libbenchmark-dev libcli11-dev
      nlohmann-json3-dev python3 python3-matplotlib)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "installing: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
