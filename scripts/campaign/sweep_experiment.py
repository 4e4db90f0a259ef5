#!/usr/bin/env python3
"""The campaign's one-GPU sweep: four configurations of experiments/gpu-1x.yaml's features (tiled
loss and both offloads on or off, tiled MLP on), their longest sequence and a curve of shorter
lengths (for plan --fit), on a model and a length range that fit in one 7-minute stage, written as a new
experiment file. --mode gpu: the given model (a 1B preset) from 8K to 128K tokens; --mode
dry-run: the tiny preset on CPU in fp32 under a 0.1 GiB limit, 256 to 4096 tokens.

  sweep_experiment.py --mode gpu --hardware h100-sxm --model llama-3.2-1b --out X.yaml SOURCE.yaml
"""
import argparse

import yaml


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("source", help="the experiment whose space is kept (experiments/gpu-1x.yaml)")
    p.add_argument("--mode", choices=["gpu", "dry-run"], required=True)
    p.add_argument("--hardware", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    with open(args.source) as f:
        e = yaml.safe_load(f)
    e["name"] = f"campaign-{args.mode}"
    e["hardware"] = args.hardware
    e["model"] = args.model
    # Four configurations of the file's features (tiled MLP on; tiled loss and both offloads on
    # or off), so that the budget leaves room for the curve's shorter lengths.
    e["space"]["memory.tiled_mlp"] = ["auto"]
    e["space"]["memory.tiled_loss"] = [1, 16]
    e["space"]["memory.offload"] = ["none", "both"]
    base = e.setdefault("base", {})
    if args.mode == "gpu":
        e["description"] = (f"{args.model} on one GPU: {args.source}'s space, 8K-128K tokens, "
                            "7 minutes")
        # curve: whole-step trials at shorter lengths too, so that plan --fit can tell GEMM,
        # attention and overhead apart (at one length they grow together).
        e["space"]["sequence.length"] = {"search": "max", "from": 8192, "to": 131072,
                                         "step": 8192, "curve": 3}
        e["budget"] = {"max_trials": 24, "wall_clock_s": 420, "trial_timeout_s": 200}
    else:
        e["description"] = f"dry run of the campaign's sweep: {args.source}'s space on CPU"
        e["memory_limit_gib"] = 0.1
        e["headroom"] = 0.1
        base.setdefault("memory", {})["precision"] = "fp32"
        base.setdefault("train", {})["device"] = "cpu"
        base["comm"] = {"timeout_s": 60, "collective_timeout_s": 60}
        e["space"]["sequence.length"] = {"search": "max", "from": 256, "to": 4096, "step": 256,
                                         "curve": 2}
        # Bounded by trials, not by the clock: on a busy machine a wall-clock budget would stop
        # the sweep after fewer trials and leave plan --fit too few to fit.
        e["budget"] = {"max_trials": 16, "wall_clock_s": 3600, "trial_timeout_s": 300}
    base.setdefault("train", {})["steps"] = 20
    text = (f"# written by scripts/campaign/sweep_experiment.py from {args.source}\n" +
            yaml.safe_dump(e, sort_keys=False, default_flow_style=None, width=100))
    with open(args.out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
