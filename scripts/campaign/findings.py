#!/usr/bin/env python3
"""What the campaign's runs say about the GPU-only questions: how long offload copies take per
step, how far the allocator's reserved peak (and the memory outside it) lies above the allocated
peak, and how many times per step the host waits for the GPU.

  findings.py alst-run DIR   DIR/alst-run.json from the alst-run stage's runs: per variant
                             (both offloads, activations only) the step time, offload and
                             optimizer time, the three peaks, the attention kernels, and the
                             host syncs per step counted by sync_count.so (runs of 2 and 4 steps:
                             (count at 4 - count at 2) / 2)
  findings.py findings OUT   OUT/findings/findings.json and findings.md: one row per question
                             with the numbers, the rule applied and the verdict, from alst-run,
                             the profile (when it ran) and the sweep's trials (when it ran)
"""
import glob
import json
import os
import sys

VARIANTS = ("both", "activations")
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cudaMemcpy")
# More host syncs per step than this is more than a training step needs: the end-of-step
# synchronize and one read of the loss.
SYNC_BUDGET = 2
# The head-room the sweeps keep below the limit (experiments/gpu-1x.yaml: 0.05).
HEADROOM = 0.05
# Optimizer offload costs too much when it adds more than this to a step.
OFFLOAD_BUDGET = 0.25


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def gib(b):
    return f"{b / 2 ** 30:.2f} GiB" if b is not None else "-"


def alst_run(directory):
    result = {"variants": {}}
    for variant in VARIANTS:
        summary = load(os.path.join(directory, variant, "summary.json"))
        if summary is None:
            continue
        v = {k: summary.get(k) for k in (
            "device", "sequence_length", "step_ms_median", "tokens_per_s_median", "mfu",
            "offload_ms_median", "optimizer_ms_median", "compute_ms_median", "phases_ms_median",
            "max_rank_peak_mem_bytes", "max_rank_peak_allocated_bytes",
            "max_rank_peak_reserved_bytes", "max_rank_outside_allocator_bytes",
            "peak_host_bytes", "attention_kernels", "memory")}
        counts = {s: load(os.path.join(directory, f"{variant}-syncs-{s}.json")) for s in (2, 4)}
        if counts[2] is not None and counts[4] is not None:
            per_step = {k: (counts[4][k] - counts[2][k]) / 2 for k in counts[4]}
            v["syncs"] = {"source": "sync_count.so (runs of 2 and 4 steps)",
                          "calls_per_step": per_step,
                          "host_syncs_per_step": sum(per_step[k] for k in SYNC_CALLS),
                          "d2h_pageable_per_step": per_step["cudaMemcpyAsync_d2h_pageable"],
                          "d2h_pinned_per_step": per_step["cudaMemcpyAsync_d2h_pinned"]}
        result["variants"][variant] = v
    if not result["variants"]:
        raise SystemExit(f"error: {directory}: no summary.json of any variant")
    with open(os.path.join(directory, "alst-run.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


def check_offload(run, profile, cpu):
    both, act = run.get("both"), run.get("activations")
    if not both or not act:
        return {"check": "Offload copy time per step", "measured": "-", "rule": "-",
                "verdict": "not measured (alst-run lacks a variant)"}
    extra = (both["step_ms_median"] - act["step_ms_median"]) / act["step_ms_median"]
    parts = [f"step {both['step_ms_median']:.1f} ms with optimizer offload vs "
             f"{act['step_ms_median']:.1f} ms without ({extra:+.0%})",
             f"offload phase {both.get('offload_ms_median') or 0:.1f} / "
             f"{act.get('offload_ms_median') or 0:.1f} ms, optimizer "
             f"{both.get('optimizer_ms_median') or 0:.1f} / "
             f"{act.get('optimizer_ms_median') or 0:.1f} ms"]
    pageable = both.get("syncs", {}).get("d2h_pageable_per_step")
    if pageable is not None:
        parts.append(f"{pageable:g} device-to-host copies into pageable memory per step")
    if profile:
        c = profile["copies_per_step"]
        parts.append(f"trace: {c['d2h']['ms']:.1f} ms D2H ({c['d2h']['bytes'] / 2 ** 20:.0f} MiB) "
                     f"+ {c['h2d']['ms']:.1f} ms H2D ({c['h2d']['bytes'] / 2 ** 20:.0f} MiB) of "
                     "copies per step")
    rule = (f"costly when optimizer offload adds more than {OFFLOAD_BUDGET:.0%} to the step or "
            "copies gradients into pageable memory (blocking) inside it")
    if cpu:
        verdict = "n/a on CPU (nothing leaves a device)"
    else:
        verdict = ("confirmed" if extra > OFFLOAD_BUDGET or (pageable or 0) > 0 else "refuted")
    return {"check": "Offload copy time per step", "measured": "; ".join(parts), "rule": rule,
            "verdict": verdict, "extra_step_fraction": extra, "d2h_pageable_per_step": pageable}


def check_memory(run, trials, cpu):
    both = run.get("both") or next(iter(run.values()))
    allocated = both.get("max_rank_peak_allocated_bytes")
    reserved = both.get("max_rank_peak_reserved_bytes")
    outside = both.get("max_rank_outside_allocator_bytes")
    rule = (f"the allocated peak alone understates the footprint when reserved + outside exceeds "
            f"it by more than the {HEADROOM:.0%} head-room")
    if cpu or allocated is None or reserved is None:
        return {"check": "Peak reserved vs allocated", "measured": "-", "rule": rule,
                "verdict": "n/a on CPU (CUDA allocator statistics only)"}
    gap = (reserved + (outside or 0) - allocated) / allocated
    measured = (f"alst-run: allocated {gib(allocated)}, reserved {gib(reserved)}, outside the "
                f"allocator {gib(outside)} (footprint {gap:+.1%} over allocated)")
    ratios = [(t["max_rank_peak_reserved_bytes"] + t.get("max_rank_outside_allocator_bytes", 0))
              / t["max_rank_peak_allocated_bytes"] - 1 for t in trials
              if t.get("max_rank_peak_allocated_bytes") and t.get("max_rank_peak_reserved_bytes")]
    if ratios:
        measured += f"; sweep trials: up to {max(ratios):+.1%} over allocated ({len(ratios)} trials)"
    worst = max([gap] + ratios)
    return {"check": "Peak reserved vs allocated", "measured": measured, "rule": rule,
            "verdict": "confirmed" if worst > HEADROOM else "refuted", "footprint_over_allocated":
            worst}


def check_syncs(run, profile, cpu):
    parts, counts = [], []
    for variant, v in run.items():
        s = v.get("syncs")
        if s:
            calls = ", ".join(f"{k} {n:g}" for k, n in s["calls_per_step"].items() if n)
            parts.append(f"{variant}: {s['host_syncs_per_step']:g} per step ({calls or 'none'})")
            counts.append(s["host_syncs_per_step"])
    if profile:
        calls = ", ".join(f"{k} {n:g}" for k, n in profile["calls_per_step"].items() if n)
        parts.append(f"trace (both offloads): {profile['host_syncs_per_step']:g} per step "
                     f"({calls or 'none'})")
        counts.append(profile["host_syncs_per_step"])
    rule = (f"more than {SYNC_BUDGET} per step (the end-of-step synchronize and one loss read) "
            "is avoidable waiting")
    if cpu:
        verdict = "n/a on CPU (no CUDA calls)"
    elif not counts:
        verdict = "not measured (no sync counts and no trace)"
    else:
        verdict = "confirmed" if max(counts) > SYNC_BUDGET else "refuted"
    return {"check": "Host syncs per step", "measured": "; ".join(parts) or "-", "rule": rule,
            "verdict": verdict}


def check_attention(run, cpu):
    kernels = sorted({k for v in run.values() for k in (v.get("attention_kernels") or [])})
    fallback = [k for k in kernels if k in ("math", "sdpa_math")]
    rule = "on CUDA, a math kernel means the quadratic fallback ran"
    verdict = ("n/a on CPU" if cpu else
               "confirmed (math ran)" if fallback else "refuted (fused kernels only)")
    return {"check": "Attention kernels", "measured": ", ".join(kernels) or "-", "rule": rule,
            "verdict": verdict}


def findings(out):
    run = (load(os.path.join(out, "alst-run", "alst-run.json")) or {}).get("variants")
    if not run:
        raise SystemExit(f"error: {out}/alst-run/alst-run.json: missing (the alst-run stage)")
    profile = load(os.path.join(out, "profile", "syncs.json"))
    trials = [t for t in (load(p) for p in glob.glob(
        os.path.join(out, "sweep", "runs", "**", "summary.json"), recursive=True)) if t]
    cpu = all(v.get("device") == "cpu" for v in run.values())
    rows = [check_offload(run, profile, cpu), check_memory(run, trials, cpu),
            check_syncs(run, profile, cpu), check_attention(run, cpu)]
    sources = ["alst-run (ALST features at {} tokens, with and without optimizer offload)".format(
        next(iter(run.values())).get("sequence_length"))]
    sources.append("profile (Nsight Systems trace)" if profile else
                   "no Nsight Systems trace (the profile stage did not run)")
    if trials:
        sources.append(f"{len(trials)} sweep trials")
    directory = os.path.join(out, "findings")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "findings.json"), "w") as f:
        json.dump({"rows": rows, "sources": sources}, f, indent=1)
    lines = ["| check | measured | rule | verdict |", "|---|---|---|---|"]
    lines += [f"| {r['check']} | {r['measured']} | {r['rule']} | **{r['verdict']}** |"
              for r in rows]
    lines += ["", "From: " + "; ".join(sources) + "."]
    with open(os.path.join(directory, "findings.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("alst-run", "findings"):
        print(__doc__, file=sys.stderr)
        return 2
    (alst_run if sys.argv[1] == "alst-run" else findings)(sys.argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
