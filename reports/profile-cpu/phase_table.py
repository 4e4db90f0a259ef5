#!/usr/bin/env python3
"""Where a run's step time goes: phase and category medians from metrics.jsonl / summary.json.

Usage: reports/profile-cpu/phase_table.py RUN_DIR   (prints a markdown table)
Phases are inclusive (forward contains attention, mlp and the forward all-to-alls; backward
contains the backward all-to-alls); categories are exclusive and add up to the timed part of
the step (src/profile/phase_timer.h).
"""
import json
import statistics
import sys

run = sys.argv[1]
summary = json.load(open(f"{run}/summary.json"))
steps = [json.loads(line) for line in open(f"{run}/metrics.jsonl") if '"step"' in line]
measured = [m for m in steps if m["step"] > summary["warmup_steps"]] or steps
step_ms = statistics.median(m["step_ms"] for m in measured)

print(f"{run}: {len(measured)} measured steps, median step {step_ms:.1f} ms\n")
print("| phase (inclusive) | median ms | % of step |")
print("|---|---:|---:|")
for name, ms in sorted(summary["phases_ms_median"].items(), key=lambda kv: -kv[1]):
    print(f"| {name} | {ms:.1f} | {100 * ms / step_ms:.1f} |")
print("\n| category (exclusive) | median ms | % of step |")
print("|---|---:|---:|")
for key in ["compute_ms", "comm_ms", "exposed_comm_ms", "optimizer_ms", "offload_ms"]:
    ms = statistics.median(m[key] for m in measured)
    print(f"| {key[:-3]} | {ms:.1f} | {100 * ms / step_ms:.1f} |")
timed = statistics.median(
    (m["compute_ms"] + m["comm_ms"] + m["optimizer_ms"] + m["offload_ms"]) / m["step_ms"]
    for m in measured)
print(f"\ntimed share of the step (categories / step_ms, median): {timed:.4f}")
print(f"tokens/s per rank {summary['tokens_per_s_per_rank_median']:.1f}, "
      f"model TFLOP/s per rank {summary.get('tflops_per_rank_median', 0):.6f}, "
      f"MFU {summary.get('mfu', float('nan')):.4f} "
      f"(model FLOPs per step {summary.get('model_flops_per_step', 0):.4g})")
