#!/usr/bin/env python3
"""The multi-rank paths of ulysses-train, each against its single-process (or stage-0) run on the
same weights and tokens: ring attention (4 query heads over 2 KV heads at sp 4 = 2 all-to-all x 2
ring) on packed documents, an uneven head split whose ranks straddle GQA groups (6 query heads over
2 KV heads at sp 4), the optimizer offloaded at ZeRO-0 over 2 ranks, and ZeRO-3 with parameters cut
in parts and the optimizer offloaded at dp 2 x sp 2 (against ZeRO-0 on the same mesh).

On a GPU node the ranks go through NCCL when there is a GPU per rank, else through Gloo over CUDA
tensors with several ranks on one GPU (correct, not fast: the peaks are then of several processes
on one device). bf16 on CUDA (8192 tokens, head_dim 64), fp32 on CPU (--device cpu: 256 tokens,
tiny shapes). Each step's loss must be within the tolerance of its reference: bf16 2e-3 relative
(about half of bf16's 3.9e-3 epsilon; the paths differ in summation order, measured up to 8.1e-5 on
one H200), fp32 1e-5.

  multirank.py --bin BUILD/bin --out DIR [--device cuda|cpu]

Beside each run's measured peak (the largest rank's) stands the cost model's prediction for its
run config (`ulysses-tune plan --config`, the model's defaults for the device type): through NCCL
with a GPU per rank the two compare one to one; with several ranks on one GPU the measured peak is
of several processes on one device.

Writes DIR/<run>/run.yaml and its output, DIR/multirank.tsv (one row per comparison) and
DIR/multirank.json; prints one line per comparison. Exit status 0 when every comparison holds, 1
when one does not or a run failed.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import yaml

STEPS = 4
TOLERANCE = {"bf16": 2e-3, "fp32": 1e-5}


def model(heads, kv_heads, head_dim, vocab):
    return {"hidden_size": heads * head_dim, "num_layers": 2, "num_heads": heads,
            "num_kv_heads": kv_heads, "head_dim": head_dim,
            "intermediate_size": 4 * heads * head_dim, "vocab_size": vocab}


def runs(device, backend):
    """name -> (ranks, run-config sections) and the comparisons (run, reference, what)."""
    gpu = device == "cuda"
    # eod 7 in the vocabulary: about 16 documents per sequence on either device; ZeRO-3's buckets
    # small enough that parameters are cut in parts.
    head_dim, length, vocab, bucket_mb = (64, 8192, 512, 0.25) if gpu else (8, 256, 16, 0.002)
    precision = "bf16" if gpu else "fp32"
    ring_model = model(4, 2, head_dim, vocab)
    uneven_model = model(6, 2, head_dim, vocab)

    def run(mdl, dp=1, sp=1, **sections):
        config = {
            "model": dict(mdl),
            "mesh": {"dp": dp, "sp": sp},
            "sequence": {"length": length, "micro_batch": 1, "grad_accum": 1},
            "data": {"source": "synthetic", "seed": 3, "pack": True, "eod_token": 7},
            "memory": {"precision": precision},
            "train": {"device": device, "steps": STEPS, "seed": 0},
            "optim": {"lr": 1e-3},
            "comm": {"backend": backend, "timeout_s": 120, "collective_timeout_s": 300},
            "profile": {"warmup_steps": 1},
        }
        for section, fields in sections.items():
            config[section] = dict(config.get(section, {}), **fields)
        return dp * sp, config

    table = {
        "ring1": run(ring_model),
        "ring22": run(ring_model, sp=4, mesh={"sp_ring": 2}),
        "unev1": run(uneven_model),
        "unev4": run(uneven_model, sp=4, mesh={"uneven_heads": True}),
        "z0off2": run(ring_model, sp=2, memory={"offload_optimizer": True}),
        "z0ref": run(ring_model, dp=2, sp=2),
        "z3off": run(ring_model, dp=2, sp=2, memory={"offload_optimizer": True},
                     zero={"stage": 3, "bucket_mb": bucket_mb}),
    }
    comparisons = [
        ("ring22", "ring1", "ring 2 x 2 (sp 4) on packed documents vs sp 1"),
        ("unev4", "unev1", "uneven heads 6/2 KV at sp 4 (straddles GQA groups) vs sp 1"),
        ("z0off2", "ring1", "ZeRO-0 + optimizer offload, sp 2, vs sp 1"),
        ("z3off", "z0ref", "ZeRO-3 in parts + optimizer offload, dp 2 x sp 2, vs ZeRO-0"),
    ]
    return table, comparisons, precision


def gpu_count():
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:  # no torch here: count them as nvidia-smi lists them
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        return len(out.stdout.splitlines()) if out.returncode == 0 else 0


def train(bin_dir, out, name, ranks, config):
    """Runs one configuration; returns (exit status, seconds, losses, summary)."""
    run_dir = os.path.join(out, name)
    os.makedirs(run_dir, exist_ok=True)
    config = dict(config, output={"dir": os.path.join(run_dir, "out")})
    path = os.path.join(run_dir, "run.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    if ranks == 1:
        command = [os.path.join(bin_dir, "ulysses-train"), "--config", path]
    else:
        command = [os.path.join(bin_dir, "ulysses-tune"), "launch", path, "--nproc", str(ranks)]
    start = time.monotonic()
    with open(os.path.join(run_dir, "log"), "w") as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        status = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    seconds = time.monotonic() - start
    losses, summary = [], {}
    metrics = os.path.join(run_dir, "out", "metrics.jsonl")
    if status == 0 and os.path.exists(metrics):
        with open(metrics) as f:
            losses = [r["loss"] for r in map(json.loads, f) if "step" in r]
        with open(os.path.join(run_dir, "out", "summary.json")) as f:
            summary = json.load(f)
    return status, seconds, losses, summary


def predicted_peak(bin_dir, run_dir, device):
    """The cost model's peak bytes per rank for the run's config, or None when plan fails."""
    hardware = "h100-sxm" if device == "cuda" else "cpu-local"  # coefficients by device type
    done = subprocess.run([os.path.join(bin_dir, "ulysses-tune"), "plan", "--config",
                           os.path.join(run_dir, "run.yaml"), "--hardware", hardware, "--json"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        print(f"plan --config {run_dir}/run.yaml: {done.stderr.strip()}", flush=True)
        return None
    return json.loads(done.stdout)["peak_bytes"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", required=True, help="directory of ulysses-train and ulysses-tune")
    p.add_argument("--out", required=True, help="directory for the runs and the results")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = p.parse_args()
    gpus = gpu_count() if args.device == "cuda" else 0
    if args.device == "cuda" and gpus == 0:
        sys.exit("error: --device cuda: this node has no CUDA device (--device cpu runs on CPU)")
    table, comparisons, precision = runs(args.device, "gloo")
    widest = max(ranks for ranks, _ in table.values())
    backend = "nccl" if args.device == "cuda" and gpus >= widest else "gloo"
    if backend == "nccl":
        table, comparisons, precision = runs(args.device, backend)
    tolerance = TOLERANCE[precision]
    os.makedirs(args.out, exist_ok=True)
    print(f"multirank: {args.device}, {precision}, {backend}"
          + (f" ({gpus} GPU{'s' if gpus != 1 else ''})" if args.device == "cuda" else "")
          + f", {STEPS} steps, loss tolerance {tolerance:g} relative", flush=True)

    results = {}
    for name, (ranks, config) in table.items():
        status, seconds, losses, summary = train(args.bin, args.out, name, ranks, config)
        results[name] = {"ranks": ranks, "exit": status, "seconds": round(seconds, 1),
                         "losses": losses,
                         "max_rank_peak_mem_bytes": summary.get("max_rank_peak_mem_bytes"),
                         "predicted_peak_bytes": predicted_peak(
                             args.bin, os.path.join(args.out, name), args.device)}
        print(f"{name}: {ranks} rank{'s' if ranks > 1 else ''}, exit {status}, {seconds:.0f} s",
              flush=True)

    rows, ok = [], True
    for run, reference, what in comparisons:
        a, b = results[run], results[reference]
        if a["exit"] or b["exit"] or len(a["losses"]) != STEPS or len(b["losses"]) != STEPS:
            verdict, worst = "failed", None
            why = f"exit {a['exit']} and {b['exit']}, {len(a['losses'])} and {len(b['losses'])} steps"
        else:
            worst = max(abs(x - y) / abs(y) for x, y in zip(a["losses"], b["losses"]))
            verdict = "ok" if worst <= tolerance else "differs"
            why = ""
        ok = ok and verdict == "ok"
        rows.append({"run": run, "reference": reference, "what": what, "verdict": verdict,
                     "worst_loss_rel": worst, "tolerance": tolerance, "note": why,
                     "peak_bytes": a["max_rank_peak_mem_bytes"],
                     "predicted_peak_bytes": a["predicted_peak_bytes"],
                     "reference_peak_bytes": b["max_rank_peak_mem_bytes"],
                     "reference_predicted_peak_bytes": b["predicted_peak_bytes"]})
        print(f"{verdict:7s} {what}: worst loss rel "
              + (f"{worst:.2e}" if worst is not None else "-") + (f" ({why})" if why else ""))
    with open(os.path.join(args.out, "multirank.json"), "w") as f:
        json.dump({"device": args.device, "precision": precision, "backend": backend,
                   "gpus": gpus, "steps": STEPS, "tolerance": tolerance, "comparisons": rows,
                   "runs": results}, f, indent=1)
    with open(os.path.join(args.out, "multirank.tsv"), "w") as f:
        f.write("run\treference\tverdict\tworst_loss_rel\ttolerance\tpeak_mib\tpredicted_peak_mib"
                "\treference_peak_mib\treference_predicted_peak_mib\twhat\n")
        for r in rows:
            mib = [f"{x / 2**20:.0f}" if x else "-"
                   for x in (r["peak_bytes"], r["predicted_peak_bytes"], r["reference_peak_bytes"],
                             r["reference_predicted_peak_bytes"])]
            worst = f"{r['worst_loss_rel']:.2e}" if r["worst_loss_rel"] is not None else "-"
            f.write(f"{r['run']}\t{r['reference']}\t{r['verdict']}\t{worst}\t{r['tolerance']:g}\t"
                    + "\t".join(mib) + f"\t{r['what']}\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
