#!/usr/bin/env python3
"""The campaign's one-GPU sweep: four configurations of experiments/gpu-1x.yaml's features (tiled
loss and both offloads on or off, tiled MLP on), their longest sequence and a curve of shorter
lengths (for plan --fit), on a model and a length range that fit in one 7-minute stage, written as a new
experiment file. --mode gpu: the given model (a 1B preset) from 8K to 128K tokens; --mode
dry-run: the tiny preset on CPU in fp32 under a 0.1 GiB limit, 256 to 4096 tokens.

  sweep_experiment.py --mode gpu --hardware h100-sxm --model llama-3.2-1b --out X.yaml SOURCE.yaml

With --quick the source (experiments/gpu-quick.yaml) keeps its space and lengths on a GPU; its
dry run is the same space on CPU at 256 and 2048 tokens, a small model with a 16K vocabulary under a
0.42 GiB limit, where the untiled loss runs out of memory at 2048 as the 1B model's does at 64K.
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
    p.add_argument("--quick", action="store_true",
                   help="the quick campaign's sweep: keep the source's space and lengths")
    p.add_argument("--backend", choices=["deepspeed"],
                   help="with --quick: the same configurations at the shortest length on this "
                        "backend")
    args = p.parse_args()
    with open(args.source) as f:
        e = yaml.safe_load(f)
    e["name"] = f"campaign-{args.mode}"
    e["hardware"] = args.hardware
    e["model"] = args.model
    if args.quick:
        return write(args, quick(args, e))
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
        dry_run_on_cpu(e)
        e["space"]["sequence.length"] = {"search": "max", "from": 256, "to": 4096, "step": 256,
                                         "curve": 2}
        # Bounded by trials, not by the clock: on a busy machine a wall-clock budget would stop
        # the sweep after fewer trials and leave plan --fit too few to fit.
        e["budget"] = {"max_trials": 16, "wall_clock_s": 3600, "trial_timeout_s": 300}
    base.setdefault("train", {})["steps"] = 20
    return write(args, e)


def dry_run_on_cpu(e):
    """The experiment `e` on CPU in fp32 under a 0.1 GiB limit."""
    e["memory_limit_gib"] = 0.1
    e["headroom"] = 0.1
    base = e.setdefault("base", {})
    base.setdefault("memory", {})["precision"] = "fp32"
    base.setdefault("train", {})["device"] = "cpu"
    base["comm"] = {"timeout_s": 60, "collective_timeout_s": 60}


def quick(args, e):
    e["name"] = f"quick-{args.mode}"
    if args.mode == "dry-run":
        e["description"] = f"dry run of the quick campaign's sweep: {args.source}'s space on CPU"
        dry_run_on_cpu(e)
        # A vocabulary large enough that the untiled loss dominates memory, as it does at 64K.
        del e["model"]
        e["base"]["model"] = {"hidden_size": 64, "num_layers": 2, "num_heads": 4,
                              "num_kv_heads": 2, "head_dim": 16, "intermediate_size": 128,
                              "vocab_size": 16384}
        e["memory_limit_gib"] = 0.42
        e["space"]["sequence.length"] = [256, 2048]
        e["target_length"] = 2048
        e["budget"]["trial_timeout_s"] = 300
    if args.backend:
        e["name"] = f"quick-{args.mode}-{args.backend}"
        e["backend"] = args.backend
        e["space"]["sequence.length"] = e["space"]["sequence.length"][:1]
        e["target_length"] = e["space"]["sequence.length"][0]
        e["space"]["memory.tiled_loss"] = ["auto"]
        e["space"]["memory.offload"] = ["none", "both"]
    return e


def write(args, e):
    text = (f"# written by scripts/campaign/sweep_experiment.py from {args.source}\n" +
            yaml.safe_dump(e, sort_keys=False, default_flow_style=None, width=100))
    with open(args.out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
