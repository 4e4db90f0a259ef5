#!/usr/bin/env python3
"""Parts (b) and (c) of the CPU baseline (see README.md; run.sh calls this).

train:  one training run per process, interleaved by round (ours plain, transformers without
        checkpointing, ours with all memory features, transformers with gradient checkpointing),
        at each length; writes train.jsonl (one record per run) and prints the medians.
maxlen: the longest sequence that trains one step under the same per-process memory cap, for
        ours (all memory features; and without the offloads) and transformers (gradient
        checkpointing): doubling from
        --start, then bisection until hi - lo <= lo * --resolution; writes maxlen.jsonl.

Peak RSS of every run = ru_maxrss of the child from os.wait4 (the same measurement for both; the
whole process, libraries included); ulysses-train's own peak_host_bytes (summary.json) is kept
beside it. Step time: the last step's milliseconds (metrics.jsonl for ours, the script's timer
for transformers), tokens/s = length / that time.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

OURS_FEATURES = {
    "plain": [],
    "all": ["memory.tiled_mlp=auto", "memory.tiled_loss=8", "memory.checkpointing=true",
            "memory.offload_activations=true", "memory.offload_optimizer=true"],
    # "all" without the two offloads, which on a CPU rank move nothing off the device (host memory
    # is device memory) and add host copies (optimizer offload: fp32 masters + gradient staging).
    "tiled": ["memory.tiled_mlp=auto", "memory.tiled_loss=8", "memory.checkpointing=true"],
}
CONFIGS = ["ours-plain", "hf-sdpa", "ours-all", "hf-sdpa-ckpt"]


def run_child(cmd, env, log_path, timeout):
    """Runs cmd; returns (exit status, peak RSS bytes of the child, wall seconds, timed_out)."""
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = t0 + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                return None, usage.ru_maxrss * 1024, time.perf_counter() - t0, True
            time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss * 1024, time.perf_counter() - t0, False


def ours_config(args, length, steps, out_dir):
    text = (f"# written by reports/cpu-baseline/compare.py\n"
            f"model: {{load: {json.dumps(args.model_dir)}}}\n"
            f"mesh: {{sp: 1, dp: 1}}\n"
            f"sequence: {{length: {length}, micro_batch: 1, grad_accum: 1}}\n"
            f"data: {{source: {json.dumps('tokens:' + args.tokens)}, token_dtype: uint16}}\n"
            f"attention: {{backend: {args.attention_backend}}}\n"
            f"optim: {{lr: 1.0e-3, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: 0.0, "
            f"grad_clip: 1.0}}\n"
            f"train: {{steps: {steps}, seed: 0, device: cpu}}\n"
            f"profile: {{warmup_steps: {steps - 1}}}\n"
            f"output: {{dir: {json.dumps(out_dir)}}}\n")
    path = os.path.join(out_dir + ".yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def run_case(args, config, length, steps, tag, limit_gib=0.0, timeout=None):
    """One process; returns a record (status ok|oom|error|timeout, peak, step time, loss)."""
    timeout = timeout or args.timeout
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    run_dir = os.path.join(args.out, tag)
    os.makedirs(os.path.dirname(run_dir), exist_ok=True)
    rec = {"config": config, "length": length, "steps": steps, "limit_gib": limit_gib,
           "tag": tag}
    if config.startswith("ours"):
        feature = config.split("-", 1)[1]
        cfg = ours_config(args, length, steps, run_dir)
        cmd = [os.path.join(args.bin, "ulysses-train"), "--config", cfg]
        for s in OURS_FEATURES[feature] + ([f"memory.limit_gib={limit_gib}"] if limit_gib else []):
            cmd += ["--set", s]
    else:
        cmd = [args.python, os.path.join(HERE, "hf_train_step.py"), "--model-dir", args.model_dir,
               "--tokens", args.tokens, "--length", str(length), "--steps", str(steps),
               "--threads", str(args.threads), "--limit-gib", str(limit_gib),
               "--checkpointing", "on" if config.endswith("ckpt") else "off",
               "--out", run_dir + ".json"]
    rec["command"] = " ".join(cmd)
    with open("/proc/loadavg") as f:
        rec["loadavg_1min_before"] = float(f.read().split()[0])
    rc, rss, wall, timed_out = run_child(cmd, env, run_dir + ".log", timeout)
    rec.update(exit=rc, peak_rss_bytes=rss, wall_s=wall)
    rec["status"] = ("timeout" if timed_out else "ok" if rc == 0 else "oom" if rc == 12
                     else "error")
    if rec["status"] == "ok":
        if config.startswith("ours"):
            with open(os.path.join(run_dir, "metrics.jsonl")) as f:
                steps_rec = [json.loads(x) for x in f if x.strip()]
            steps_rec = [s for s in steps_rec if "step" in s and "loss" in s]
            with open(os.path.join(run_dir, "summary.json")) as f:
                summary = json.load(f)
            rec["step_ms"] = steps_rec[-1]["step_ms"]
            rec["first_step_ms"] = steps_rec[0]["step_ms"]
            rec["loss"] = [s["loss"] for s in steps_rec]
            rec["own_peak_bytes"] = summary.get("peak_host_bytes")
            rec["phases_last"] = steps_rec[-1].get("phases")
        else:
            with open(run_dir + ".json") as f:
                out = json.load(f)
            rec["step_ms"] = out["step_ms"][-1]
            rec["first_step_ms"] = out["step_ms"][0]
            rec["loss"] = out["loss"]
            rec["own_peak_bytes"] = out.get("peak_rss_bytes")
            rec["attn_implementation"] = out.get("attn_implementation")
        rec["tokens_per_s"] = length / (rec["step_ms"] / 1e3)
    else:
        with open(run_dir + ".log", errors="replace") as f:
            tail = f.read()[-600:]
        rec["log_tail"] = tail
    return rec


def gib(b):
    return b / 2 ** 30


def cmd_train(args):
    lengths = [int(x) for x in args.lengths.split(",")]
    path = os.path.join(args.out, "train.jsonl")
    records = []
    with open(path, "a") as out:
        for length in lengths:
            reps = args.reps if length < args.long_from else args.reps_long
            steps = args.steps if length < args.long_from else args.steps_long
            for rep in range(reps):
                for config in CONFIGS:
                    rec = run_case(args, config, length, steps, f"train/{config}-{length}-r{rep}")
                    rec["rep"] = rep
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
                    records.append(rec)
                    print(f"{config:14s} L={length:6d} rep {rep}: {rec['status']:7s} "
                          f"peak {gib(rec['peak_rss_bytes']):.2f} GiB  "
                          f"step {rec.get('step_ms', float('nan')) / 1e3:.2f} s  "
                          f"loss {rec.get('loss')}", flush=True)
    print_train_table(records)


def print_train_table(records):
    print("\n| length | configuration | runs | tokens/s (median) | step s (median) | "
          "first step s (median) | peak RSS GiB (median) | own peak GiB | loss step 1 |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    keys = sorted({(r["length"], r["config"]) for r in records},
                  key=lambda k: (k[0], CONFIGS.index(k[1])))
    for length, config in keys:
        runs = [r for r in records if r["length"] == length and r["config"] == config]
        ok = [r for r in runs if r["status"] == "ok"]
        if not ok:
            print(f"| {length} | {config} | {len(runs)} | {runs[0]['status']} | | "
                  f"{gib(runs[0]['peak_rss_bytes']):.2f} | |")
            continue
        tps = statistics.median(r["tokens_per_s"] for r in ok)
        ms = statistics.median(r["step_ms"] for r in ok)
        first = statistics.median(r["first_step_ms"] for r in ok)
        rss = statistics.median(r["peak_rss_bytes"] for r in ok)
        own = statistics.median(r["own_peak_bytes"] for r in ok)
        print(f"| {length} | {config} | {len(ok)} | {tps:.0f} | {ms / 1e3:.2f} | "
              f"{first / 1e3:.2f} | {gib(rss):.2f} | {gib(own):.2f} | {ok[0]['loss'][0]:.6f} |")


def cmd_maxlen(args):
    path = os.path.join(args.out, "maxlen.jsonl")
    results = {}
    with open(path, "a") as out:
        for config in args.maxlen_configs.split(","):
            tried = {}

            def fits(length):
                rec = run_case(args, config, length, 1, f"maxlen/{config}-{length}",
                               limit_gib=args.limit_gib, timeout=args.probe_timeout)
                out.write(json.dumps(rec) + "\n")
                out.flush()
                tried[length] = rec
                print(f"{config:14s} limit {args.limit_gib} GiB  L={length:7d}: "
                      f"{rec['status']:7s} peak {gib(rec['peak_rss_bytes']):.2f} GiB "
                      f"({rec['wall_s']:.0f} s)", flush=True)
                if rec["status"] in ("error", "timeout"):
                    return None
                return rec["status"] == "ok"

            lo, hi, note = 0, None, ""
            length = args.start
            while True:  # doubling
                ok = fits(length)
                if ok is None:
                    note = f"probe at {length} ended with {tried[length]['status']}"
                    break
                if not ok:
                    hi = length
                    break
                lo = length
                length *= 2
            while hi is not None and hi - lo > max(lo * args.resolution, args.granule):
                mid = (lo + hi) // 2 // args.granule * args.granule
                ok = fits(mid)
                if ok is None:
                    note = f"probe at {mid} ended with {tried[mid]['status']}"
                    break
                if ok:
                    lo = mid
                else:
                    hi = mid
            results[config] = {"config": config, "max_ok": lo, "min_fail": hi, "note": note,
                               "limit_gib": args.limit_gib,
                               "peak_at_max_gib": gib(tried[lo]["peak_rss_bytes"]) if lo else None}
            out.write(json.dumps({"result": results[config]}) + "\n")
    print("\n| configuration | longest that trains | shortest that fails | peak RSS at longest "
          "(GiB) | note |")
    print("|---|---:|---:|---:|---|")
    for r in results.values():
        peak = f"{r['peak_at_max_gib']:.2f}" if r["peak_at_max_gib"] else ""
        print(f"| {r['config']} | {r['max_ok']} | {r['min_fail'] or ''} | {peak} | {r['note']} |")
    theirs = [r for r in results.values() if r["config"].startswith("hf")]
    for r in results.values():
        if r["config"].startswith("ours") and theirs and theirs[0]["max_ok"]:
            print(f"ratio {r['config']} / {theirs[0]['config']} = "
                  f"{r['max_ok'] / theirs[0]['max_ok']:.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("part", choices=["train", "maxlen"])
    p.add_argument("--bin", required=True)
    p.add_argument("--python", required=True, help="the venv Python with transformers")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--attention-backend", default="auto")
    p.add_argument("--timeout", type=float, default=900)
    # train
    p.add_argument("--lengths", default="1024,4096,16384")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--reps-long", type=int, default=1)
    p.add_argument("--long-from", type=int, default=16384,
                   help="lengths >= this use --reps-long rounds and --steps-long steps")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--steps-long", type=int, default=2)
    # maxlen
    p.add_argument("--limit-gib", type=float, default=2.0)
    p.add_argument("--maxlen-configs", default="ours-all,ours-tiled,hf-sdpa-ckpt")
    p.add_argument("--start", type=int, default=1024)
    p.add_argument("--resolution", type=float, default=0.125)
    p.add_argument("--granule", type=int, default=256)
    p.add_argument("--probe-timeout", type=float, default=420)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    {"train": cmd_train, "maxlen": cmd_maxlen}[args.part](args)


if __name__ == "__main__":
    sys.exit(main())
