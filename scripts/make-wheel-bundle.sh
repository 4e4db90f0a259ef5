#!/usr/bin/env bash
# Makes, on a machine with a package registry, the Python wheels a GPU node without one needs for
# the DeepSpeed baseline: a DeepSpeed wheel built without its C++ ops (they are compiled on the
# node when first used), and the wheels of DeepSpeed's dependencies for the node's Python version
# and platform, minus torch, triton and NVIDIA's packages (the node's PyTorch brings them) and
# minus what the node already has. Carry DIR to the node and run
# `scripts/gpu-campaign.sh --quick OUT --wheels DIR`: it installs into a private directory only
# the wheels whose package the node's Python lacks.
#
# Usage: scripts/make-wheel-bundle.sh DIR [--python-version X.Y] [--platform TAG] [--have FILE]
#                                         [--deepspeed VERSION] [--python PY]
#   DIR               output directory (new or empty)
#   --python-version  the node's Python (default 3.12)
#   --platform        the node's wheel platform tag (default manylinux2014_x86_64)
#   --have FILE       the node's `python -m pip list --format=freeze` (the quick campaign keeps it
#                     as campaign/build/python-packages.txt): those packages are left out
#   --deepspeed V     the DeepSpeed release (default: the one PY has, else the newest)
#   --python PY       a Python with PyTorch here, to build the DeepSpeed wheel (default:
#                     the project's .venv, else python3)
# Exit status: 0 made, 1 a download or build failed, 2 bad usage.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="" pyver=3.12 platform=manylinux2014_x86_64 have="" ds_version="" python=""
while [ $# -gt 0 ]; do
  case $1 in
    --python-version) pyver=${2:?--python-version X.Y}; shift 2 ;;
    --platform) platform=${2:?--platform TAG}; shift 2 ;;
    --have) have=${2:?--have FILE}; shift 2 ;;
    --deepspeed) ds_version=${2:?--deepspeed VERSION}; shift 2 ;;
    --python) python=${2:?--python PY}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "make-wheel-bundle: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [ -z "$dir" ] || { echo "make-wheel-bundle: one DIR only" >&2; exit 2; }; dir=$1; shift ;;
  esac
done
[ -n "$dir" ] || { echo "usage: scripts/make-wheel-bundle.sh DIR [--python-version X.Y] (see --help)" >&2; exit 2; }
[[ $pyver =~ ^3\.[0-9]+$ ]] || { echo "make-wheel-bundle: --python-version: '$pyver' is not 3.N" >&2; exit 2; }
[ -z "$have" ] || [ -f "$have" ] || { echo "make-wheel-bundle: --have: no file $have" >&2; exit 2; }
if [ -e "$dir" ] && { [ ! -d "$dir" ] || [ -n "$(ls -A "$dir")" ]; }; then
  echo "make-wheel-bundle: $dir exists and is not an empty directory; choose a new DIR" >&2; exit 2
fi
if [ -z "$python" ]; then
  python=python3
  [ -x "$root/.venv/bin/python" ] && python=$root/.venv/bin/python
fi
"$python" -c 'import torch' 2> /dev/null ||
  { echo "make-wheel-bundle: $python cannot import torch (DeepSpeed's setup needs it; pass --python)" >&2; exit 2; }
if [ -z "$ds_version" ]; then
  ds_version=$("$python" -c 'import importlib.metadata as m; print(m.version("deepspeed"))' 2> /dev/null || true)
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/wheel-bundle.XXXXXX")
trap 'rm -rf "$work"' EXIT

# 1. DeepSpeed without its ops (DS_BUILD_OPS=0: a pure-Python wheel; ops are JIT-built on use).
echo "== deepspeed ${ds_version:-newest}, no prebuilt ops"
DS_BUILD_OPS=0 "$python" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$work/ds" \
  "deepspeed${ds_version:+==$ds_version}"
cp "$work"/ds/deepspeed-*.whl "$dir/"

# 2. Its dependencies, for the node's Python and platform, without what the node brings.
"$python" - "$work"/ds/deepspeed-*.whl "$have" > "$work/requirements.txt" << 'EOF'
import re, sys, zipfile
from packaging.requirements import Requirement
wheel, have = sys.argv[1], sys.argv[2]
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
reqs = [Requirement(l.split(":", 1)[1].strip()) for l in lines if l.startswith("Requires-Dist:")]
node = set()
if have:
    node = {norm(re.split(r"[=<>!~ @]", l.strip(), 1)[0]) for l in open(have) if l.strip()}
brought = {"torch", "triton"}
for r in reqs:
    name = norm(r.name)
    if r.marker and "extra" in str(r.marker):
        continue
    if name in brought or name.startswith("nvidia-") or name in node:
        continue
    print(str(r))
EOF
echo "== dependencies for Python $pyver ($platform): $(tr '\n' ' ' < "$work/requirements.txt")"
if [ -s "$work/requirements.txt" ]; then
  # With their own dependencies (pydantic's core, ...), still without torch: resolved for the
  # node's Python, binary wheels only.
  "$python" -m pip download --quiet --dest "$work/deps" --only-binary=:all: \
    --python-version "$pyver" --platform "$platform" --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --platform any --implementation cp \
    -r "$work/requirements.txt"
  for wheel in "$work"/deps/*.whl; do
    name=$(basename "$wheel" | cut -d- -f1 | tr '[:upper:]_.' '[:lower:]--')
    case $name in torch|triton|nvidia-*) continue ;; esac
    if [ -n "$have" ] && grep -iqE "^${name//-/[-_.]}(==| |$)" "$have"; then continue; fi
    cp "$wheel" "$dir/"
  done
fi
( cd "$dir" && ls -1 *.whl > MANIFEST.txt && du -sh . | cut -f1 | sed 's/^/size: /' )
echo "bundle: $dir ($(grep -c . "$dir/MANIFEST.txt") wheels; $(du -sh "$dir" | cut -f1))"
