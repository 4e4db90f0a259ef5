#!/usr/bin/env python3
"""The deepspeed trial backend against ulysses-train, through real sweeps (ulysses-tune sweep with
`backend: [native, deepspeed]`) on CPU with Gloo: a tiny Llama made by transformers' own class
(norm weights moved away from their init of 1, so that one dropped or misplaced shows), the same
weights (model.load) and tokens for both. Checks:

  - every step's loss and grad norm of the DeepSpeed trial equal ulysses-train's at sp 2, untiled
    and with tiled MLP and tiled loss (2 tiles each), fp32 (ds_backend_test.py runs the rank
    program on the meshes with dp 2, micro-batches, grad accumulation and the ZeRO stages);
  - the ds_config.json each DeepSpeed trial ran is what `ulysses-tune export --format deepspeed`
    writes for that trial (DeepSpeed's own deepspeed.initialize accepted it: the trial ran);
  - running out of memory is `oom` (exit 12): a DeepSpeed ZeRO-1 trial with 2 GiB buckets
    (zero.bucket_mb 2048, exported as reduce_bucket_size 5e8 fp32 elements) under a 1 GiB cap,
    so that the allocation that fails is DeepSpeed's bucket in each rank's main thread (under a
    smaller cap the address space can run out where Gloo starts its threads, which aborts the
    process instead);
  - summary.json names the backend, its versions and its workarounds.

  deepspeed_backend_test.py --bin BUILD/bin
"""
import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM

# fp32 on both sides; the two stacks sum the same products in other orders (SDPA vs our attention,
# Gloo's all-reduce vs DeepSpeed's bucketed one), which moves the loss by ~1e-7 relative and the
# untiled gradient norm by ~2e-7 after three updates. Tiled, each stack rounds its own way (ours:
# a tile's logsumexp from its softmax, a weight's gradient summed over the tiles inside the GEMM;
# DeepSpeed's: autograd per tile): at sp 2 x dp 1 the step-3 norm of each stack's tiled run is
# 5-7e-6 from its own untiled run, on opposite sides, so 1.1e-5 apart. The bounds leave a factor of
# 2 above that for the norm and 10 for the loss.
LOSS_RTOL = 1e-6
GRAD_NORM_RTOL = 2e-5


def make_model(path):
    torch.manual_seed(3)
    config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, intermediate_size=128,
                         vocab_size=512, tie_word_embeddings=False, rms_norm_eps=1e-5,
                         rope_theta=10000.0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path, safe_serialization=True)


def experiment(path, name, world, sp, tiles, backends="[native, deepspeed]", limit=2.0, zero=0,
               bucket_mb=128):
    text = f"""name: {name}
hardware: cpu-local
world_size: {world}
memory_limit_gib: {limit}
backend: {backends}
base:
  model: {{load: {os.path.dirname(path)}/model}}
  data: {{source: synthetic, seed: 5}}
  memory: {{tiled_mlp: {tiles}, tiled_loss: {tiles}}}
  zero: {{stage: {zero}, bucket_mb: {bucket_mb}}}
  train: {{device: cpu, steps: 4}}
  optim: {{lr: 0.01}}
  comm: {{timeout_s: 120, collective_timeout_s: 120}}
space:
  mesh.sp: [{sp}]
  sequence.length: [256]
objective: throughput
budget: {{trial_timeout_s: 300}}
trial: {{warmup_steps: 1, steps: 2}}
search: {{method: grid, probe: false, prune: false}}
"""
    with open(path, "w") as f:
        f.write(text)


def steps_of(run_dir):
    with open(os.path.join(run_dir, "out", "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "step" in r]


def close(a, b, rtol):
    return abs(a - b) <= rtol * max(abs(a), abs(b))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", required=True, help="directory of ulysses-tune and ulysses-train")
    args = p.parse_args()
    tune = os.path.join(args.bin, "ulysses-tune")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        make_model(os.path.join(tmp, "model"))
        db = os.path.join(tmp, "results.db")
        cases = [("sp2dp1", 2, 2, 1), ("sp2dp1-tiled", 2, 2, 2)]
        for name, world, sp, tiles in cases:
            path = os.path.join(tmp, name + ".yaml")
            experiment(path, name, world, sp, tiles)
            subprocess.run([tune, "sweep", path, "--db", db, "--name", name, "--python",
                            sys.executable], check=True, stdout=subprocess.DEVNULL)
        # Out of memory: DeepSpeed's ZeRO-1 with 2 GiB buckets under a 1 GiB cap.
        path = os.path.join(tmp, "oom.yaml")
        experiment(path, "oom", 2, 2, 1, backends="[deepspeed]", limit=1.0, zero=1,
                   bucket_mb=2048)
        subprocess.run([tune, "sweep", path, "--db", db, "--name", "oom", "--python",
                        sys.executable], check=True, stdout=subprocess.DEVNULL)

        con = sqlite3.connect(db)
        rows = con.execute("SELECT s.name, t.id, t.point, t.status, t.exit_code, t.run_dir, t.error "
                           "FROM trials t JOIN sweeps s ON s.id = t.sweep_id ORDER BY t.id").fetchall()
        by_sweep = {}
        for sweep, trial, point, status, exit_code, run_dir, error in rows:
            backend = json.loads(point).get("backend", "native")
            by_sweep.setdefault(sweep, {})[backend] = (trial, status, exit_code, run_dir, error)

        for name, _, _, _ in cases:
            native, ds = by_sweep[name]["native"], by_sweep[name]["deepspeed"]
            if native[1] != "ok" or ds[1] != "ok":
                failures.append(f"{name}: native {native[1]}, deepspeed {ds[1]}: {ds[4]}")
                continue
            ours, theirs = steps_of(native[3]), steps_of(ds[3])
            if len(ours) != len(theirs) or not ours:
                failures.append(f"{name}: {len(ours)} native steps, {len(theirs)} deepspeed steps")
                continue
            for a, b in zip(ours, theirs):
                if not close(a["loss"], b["loss"], LOSS_RTOL):
                    failures.append(f"{name} step {a['step']}: loss {a['loss']!r} vs {b['loss']!r}")
                if not close(a["grad_norm"], b["grad_norm"], GRAD_NORM_RTOL):
                    failures.append(f"{name} step {a['step']}: grad norm {a['grad_norm']!r} vs "
                                    f"{b['grad_norm']!r}")
            # The DeepSpeed config the trial ran is the exporter's for that trial.
            exported = subprocess.run([tune, "export", "--db", db, "--trial", str(ds[0]),
                                       "--format", "deepspeed"], check=True, capture_output=True,
                                      text=True)
            with open(os.path.join(ds[3], "ds_config.json")) as f:
                ran = json.load(f)
            if json.loads(exported.stdout) != ran:
                failures.append(f"{name}: the ds_config.json that ran is not the export")
            if "ran on the deepspeed backend" not in exported.stderr:
                failures.append(f"{name}: export does not say the trial ran on DeepSpeed")
            with open(os.path.join(ds[3], "out", "summary.json")) as f:
                summary = json.load(f)
            if summary.get("backend") != "deepspeed" or "deepspeed" not in summary.get("versions", {}):
                failures.append(f"{name}: summary.json does not name the backend and versions")
            if not summary.get("workarounds"):
                failures.append(f"{name}: summary.json names no workaround at sp 2")
            print(f"{name}: {len(ours)} steps, losses {[round(s['loss'], 6) for s in ours]}, "
                  f"max |loss diff| {max(abs(a['loss'] - b['loss']) for a, b in zip(ours, theirs)):.2e}")

        oom = by_sweep["oom"]["deepspeed"]
        if oom[1] != "oom" or oom[2] != 12 or "out of memory" not in (oom[4] or ""):
            failures.append(f"oom: status {oom[1]}, exit {oom[2]}: {oom[4]}")
        print(f"oom: status {oom[1]}, exit {oom[2]}: {oom[4]}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
