#!/usr/bin/env python3
"""Ratios from tiling_bench runs: after / before, and tiled / untiled within each build.

Usage:
  ratios.py [--real] before-1.json after-1.json [before-2.json after-2.json ...]
      Google Benchmark JSON files (--benchmark_out_format=json), alternating between the build
      before and the build after.
  ratios.py [--real] raw/run-c.jsonl
      The rows kept in raw/: one JSON object per repetition, {round, build, name, real_ms,
      cpu_ms, iterations}.
Per benchmark the median CPU time (with --real: real time) over every repetition of every run of a
build is taken. With one intra-op thread the CPU time is the work done whatever else the machine
runs; the real time also counts the waits for a core. Printed as a markdown table. The untiled
reference of BM_X<Tiled>/n is BM_XUntiled, of BM_CheckpointedLayer/n it is BM_CheckpointedLayer/1.
"""
import json
import statistics
import sys
from collections import defaultdict


def rows_of_benchmark_json(path, build):
    with open(path) as f:
        for b in json.load(f)["benchmarks"]:
            if b.get("run_type") != "iteration":
                continue
            scale = {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}[b["time_unit"]]
            yield {"build": build, "name": b["run_name"].removesuffix("/real_time"),
                   "real_ms": b["real_time"] * scale, "cpu_ms": b["cpu_time"] * scale}


def medians(rows, build, key):
    samples = defaultdict(list)  # name -> [ms]
    for r in rows:
        if r["build"] == build:
            samples[r["name"]].append(r[key])
    return {n: statistics.median(v) for n, v in samples.items()}, min(map(len, samples.values()))


def reference(name):
    if name.startswith("BM_CheckpointedLayer/"):
        return "BM_CheckpointedLayer/1"
    base = name.split("/")[0]
    return base[: -len("Tiled")] + "Untiled" if base.endswith("Tiled") else None


def main():
    args = sys.argv[1:]
    key = "cpu_ms"
    if args and args[0] == "--real":
        key, args = "real_ms", args[1:]
    if len(args) == 1 and args[0].endswith(".jsonl"):
        with open(args[0]) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    elif len(args) >= 2 and len(args) % 2 == 0:
        rows = []
        for i, path in enumerate(args):
            rows += rows_of_benchmark_json(path, "before" if i % 2 == 0 else "after")
    else:
        sys.exit(__doc__)
    before, n_before = medians(rows, "before", key)
    after, n_after = medians(rows, "after", key)
    print("| benchmark | before ms | after ms | after / before | tiled / untiled before "
          "| tiled / untiled after |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in before:
        if name not in after:
            continue
        ref = reference(name)
        tiled = ref is not None and ref != name
        tb = f"{before[name] / before[ref]:.2f}" if tiled else ""
        ta = f"{after[name] / after[ref]:.2f}" if tiled else ""
        print(f"| {name} | {before[name]:.1f} | {after[name]:.1f} | "
              f"{after[name] / before[name]:.2f} | {tb} | {ta} |")
    print(f"\n({key.replace('_ms', ' time')}, median of {n_before} samples before and "
          f"{n_after} after per benchmark)")


if __name__ == "__main__":
    main()
