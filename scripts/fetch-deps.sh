#!/usr/bin/env bash
# Gets the libraries the build needs beyond PyTorch, as Debian/Ubuntu packages unpacked into a
# prefix: no root, nothing installed system-wide. Then build with
# `scripts/build-gpu.sh --deps PREFIX`.
#
# Usage: scripts/fetch-deps.sh PREFIX [--tests] [--from DIR]
#   --tests     also GoogleTest (for scripts/build-gpu.sh --tests)
#   --from DIR  unpack the .deb files already in DIR (downloaded on another machine) instead of
#               downloading them with `apt-get download` (which needs no root)
#
# The packages: libyaml-cpp-dev, libsqlite3-dev, libcli11-dev, nlohmann-json3-dev,
# libbenchmark-dev (with their runtime libraries) and libgloo-dev (Gloo's headers: PyTorch's
# wheel ships Gloo's code but not its headers, and ProcessGroupGloo.hpp includes them);
# --tests adds googletest, libgtest-dev, libgmock-dev. They are built for Debian/Ubuntu: on
# other distributions install the same libraries from the distribution instead.
set -euo pipefail
prefix="" tests=0 from=""
while [ $# -gt 0 ]; do
  case $1 in
    --tests) tests=1; shift ;;
    --from) from=${2:?--from DIR}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fetch-deps: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) prefix=$1; shift ;;
  esac
done
[ -n "$prefix" ] || { echo "usage: scripts/fetch-deps.sh PREFIX [--tests] [--from DIR]" >&2; exit 2; }
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)

dev=(libyaml-cpp-dev libsqlite3-dev libcli11-dev nlohmann-json3-dev libbenchmark-dev libgloo-dev)
[ "$tests" = 1 ] && dev+=(googletest libgtest-dev libgmock-dev)

debs=$(mktemp -d)
chmod 755 "$debs"  # apt-get download hands the files to its own user
trap 'rm -rf "$debs"' EXIT
if [ -n "$from" ]; then
  cp "$from"/*.deb "$debs"/ 2> /dev/null || { echo "fetch-deps: no .deb files in $from" >&2; exit 2; }
else
  command -v apt-get > /dev/null ||
    { echo "fetch-deps: no apt-get here: download the .deb files elsewhere and use --from DIR" >&2; exit 2; }
  # The runtime libraries the -dev packages link to (libyaml-cpp0.7, libbenchmark1debian, ...
  # depending on the release); Gloo's runtime is inside PyTorch.
  runtime=$(apt-cache depends libyaml-cpp-dev libsqlite3-dev libbenchmark-dev 2> /dev/null |
            awk '/Depends: lib/ && $2 !~ /-dev$/ && $2 !~ /^libc6/ {print $2}' | sort -u)
  # shellcheck disable=SC2086  # one word per package
  (cd "$debs" && apt-get download "${dev[@]}" $runtime) ||
    { echo "fetch-deps: apt-get download failed (run apt-get update, or use --from DIR)" >&2; exit 1; }
fi
for deb in "$debs"/*.deb; do
  if command -v dpkg-deb > /dev/null; then
    dpkg-deb -x "$deb" "$prefix"
  else  # a .deb is an ar archive holding data.tar.*
    (cd "$debs" && ar x "$deb" && tar -xf data.tar.* -C "$prefix" && rm -f data.tar.* control.tar.* debian-binary)
  fi
  echo "unpacked $(basename "$deb")"
done
echo "fetch-deps: done; build with: scripts/build-gpu.sh --deps $prefix"
