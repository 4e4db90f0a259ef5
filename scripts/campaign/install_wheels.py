#!/usr/bin/env python3
"""Installs the wheels of a bundle (scripts/make-wheel-bundle.sh) that this Python lacks into a
private directory, for a node without a package registry: a wheel whose distribution this
Python already has (any version) is left alone, so the node's torch, numpy and transformers stay
the ones it runs. Put TARGET first on PYTHONPATH afterwards. Uses `python -m pip install
--no-index --no-deps --target` when pip is there, else unpacks the wheel (pure-Python and
platform wheels alike; their scripts are not installed). One line per wheel; exit 1 when one
could not be installed, 2 bad usage.

  install_wheels.py WHEEL_DIR TARGET
"""
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import zipfile


def normalized(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(path):
    """(distribution, version) from a wheel's file name (name-version(-build)?-py-abi-plat)."""
    parts = os.path.basename(path)[:-len(".whl")].split("-")
    if len(parts) < 5:
        raise ValueError(f"{os.path.basename(path)}: not a wheel file name")
    return normalized(parts[0]), parts[1]


def installed(target):
    """Distributions this Python has, and those already in TARGET, by normalized name."""
    have = {normalized(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()
            if d.metadata["Name"]}
    mine = {normalized(d.metadata["Name"]): d.version
            for d in importlib.metadata.distributions(path=[target]) if d.metadata["Name"]}
    return have, mine


def unpack(wheel, target):
    """A wheel's files into target: the package, its .dist-info, and its .data/purelib|platlib."""
    with zipfile.ZipFile(wheel) as z:
        for member in z.namelist():
            parts = member.split("/")
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue  # scripts, headers, data: not needed to import
                parts = parts[2:]
            dest = os.path.join(target, *parts)
            if member.endswith("/"):
                continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(member) as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst)


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    wheel_dir, target = sys.argv[1], os.path.abspath(sys.argv[2])
    wheels = sorted(os.path.join(wheel_dir, f) for f in os.listdir(wheel_dir) if f.endswith(".whl"))
    if not wheels:
        print(f"install_wheels: {wheel_dir}: no .whl files")
        return 1
    os.makedirs(target, exist_ok=True)
    have, mine = installed(target)
    todo = []
    for wheel in wheels:
        name, version = wheel_name(wheel)
        if name in mine:
            print(f"{name} {mine[name]}: installed before in {target}")
        elif name in have:
            print(f"{name}: this Python has {have[name]} (the bundle's {version} left out)")
        else:
            todo.append((name, version, wheel))
    has_pip = subprocess.run([sys.executable, "-m", "pip", "--version"],
                             capture_output=True).returncode == 0
    failed = 0
    for name, version, wheel in todo:
        if has_pip:
            r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                                "--no-deps", "--no-compile", "--target", target, wheel],
                               capture_output=True, text=True)
            ok, why = r.returncode == 0, (r.stderr.strip().splitlines() or [""])[-1]
        else:
            try:
                unpack(wheel, target)
                ok, why = True, ""
            except (OSError, zipfile.BadZipFile) as e:
                ok, why = False, str(e)
        print(f"{name} {version}: " + ("installed" if ok else f"NOT installed: {why}"))
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
