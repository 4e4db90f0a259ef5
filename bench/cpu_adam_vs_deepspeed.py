#!/usr/bin/env python3
"""The host AdamW update of optimizer offload, ours against DeepSpeed's CPUAdam, in one run on one
machine: the same parameter count, fp32 parameters, gradients, moments, the same hyperparameters
and thread count. Ours is optim_bench's BM_OffloadStepFused (AdamW kHost's step: the fused pass of
src/optim/cpu_adam.cpp), theirs deepspeed.ops.adam.DeepSpeedCPUAdam.step() (its C++ op, built by
torch's JIT loader on first use). Prints one table and writes --json.

  bench/cpu_adam_vs_deepspeed.py [--params-m 512] [--threads 2] [--reps 5] [--bin build/bin]
                                 [--json OUT.json]

Each side runs in its own process, one after the other (about 8 GiB each at 512M parameters),
each with OMP_NUM_THREADS set to --threads; the figure is the median wall time of --reps steps
after one warm-up step. params/s = parameters / step time.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHUNK = 256 << 20  # elements per parameter tensor, as optim_bench's


def deepspeed_side(args):
    """Runs in a child process: DeepSpeedCPUAdam's step times in ms, as JSON on stdout."""
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    torch.set_num_threads(args.threads)
    total = args.params_m * 1_000_000
    params = []
    for done in range(0, total, CHUNK):
        p = torch.nn.Parameter(torch.full((min(CHUNK, total - done),), 0.01))
        p.grad = torch.full_like(p, 1e-3)
        params.append(p)
    opt = DeepSpeedCPUAdam(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                           adamw_mode=True)
    opt.step()  # warm-up: the moments' first touch
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"step_ms": times}))


def ours(args):
    bench = os.path.join(args.bin, "optim_bench")
    out = subprocess.run(
        [bench, f"--benchmark_filter=BM_OffloadStepFused/{args.params_m}/0/",
         f"--benchmark_repetitions={args.reps}", "--benchmark_format=json"],
        env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)), capture_output=True, text=True,
        check=True)
    runs = [b for b in json.loads(out.stdout)["benchmarks"] if b.get("run_type") == "iteration"]
    if not runs:
        sys.exit(f"optim_bench ran no BM_OffloadStepFused/{args.params_m}/0 "
                 "(a size it lists: 512 or 1024)")
    return [b["real_time"] for b in runs], runs[0].get("label", "")


def theirs(args):
    cmd = [sys.executable, os.path.abspath(__file__), "--deepspeed-side",
           "--params-m", str(args.params_m), "--threads", str(args.threads),
           "--reps", str(args.reps)]
    out = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)),
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("DeepSpeedCPUAdam failed: " + (out.stderr.strip().splitlines() or ["?"])[-1])
    return json.loads(out.stdout.strip().splitlines()[-1])["step_ms"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--params-m", type=int, default=512, help="millions of parameters")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--json", help="write the figures here too")
    p.add_argument("--deepspeed-side", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.deepspeed_side:
        return deepspeed_side(args)
    ours_ms, isa = ours(args)
    theirs_ms = theirs(args)
    n = args.params_m * 1_000_000
    rows = []
    for name, ms in ((f"ours (fused pass, {isa})", ours_ms), ("DeepSpeedCPUAdam", theirs_ms)):
        med = statistics.median(ms)
        rows.append({"side": name, "median_ms": round(med, 1), "min_ms": round(min(ms), 1),
                     "max_ms": round(max(ms), 1), "params_per_s": n / (med / 1e3)})
    ratio = rows[1]["median_ms"] / rows[0]["median_ms"]
    print(f"{args.params_m}M fp32 parameters, {args.threads} threads, median of {args.reps} steps")
    print(f"{'side':34s} {'median ms':>10s} {'min':>8s} {'max':>8s} {'G params/s':>11s}")
    for r in rows:
        print(f"{r['side']:34s} {r['median_ms']:10.1f} {r['min_ms']:8.1f} {r['max_ms']:8.1f} "
              f"{r['params_per_s'] / 1e9:11.2f}")
    print(f"ours / DeepSpeed speed: {ratio:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"params": n, "threads": args.threads, "reps": args.reps, "rows": rows,
                       "ours_over_deepspeed_speed": ratio, "ours_ms": ours_ms,
                       "deepspeed_ms": theirs_ms,
                       "load_average": os.getloadavg()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
