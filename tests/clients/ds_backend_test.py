#!/usr/bin/env python3
"""The deepspeed backend's rank program (tuner/backends/deepspeed/ds_trial.py) started directly,
as a sweep starts it: torchrun's environment, the trial's run.yaml and the ds_config.json that
`ulysses-tune export --format deepspeed` writes for it. Each case runs ulysses-train once as a
one-trial sweep (its run.yaml, metrics and export are the reference), then ds_trial.py on the same
run config, on CPU with Gloo and a tiny Llama made by transformers' own class. Checks:

  - every step's loss and grad norm equal ulysses-train's where the sweep test does not go:
    micro batch 2 x grad accum 2 at sp 2 x dp 2 with tiled MLP and loss (the data order over dp
    ranks, micro-steps and rows), activation offload (checkpointing) under ZeRO-1, ZeRO-3 at sp 2
    with grad accum 2 and tiles (DeepSpeed's stage-3 gradient averaging over the sp ranks undone),
    and ZeRO-2 at dp 2 with micro batch 2;
  - summary.json and metrics.jsonl carry docs/outputs.md's fields, and say what ran (the layers
    recomputed or not, the workarounds);
  - bad input is one line `error: <key>: ...` and exit 2.

  ds_backend_test.py --bin BUILD/bin
"""
import argparse
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile

import numpy as np
import yaml

from deepspeed_backend_test import make_model

HERE = os.path.dirname(os.path.abspath(__file__))
DS_TRIAL = os.path.join(HERE, "..", "..", "tuner", "backends", "deepspeed", "ds_trial.py")

# fp32 on both sides; the stacks sum the same products in other orders (SDPA vs our attention,
# other all-reduces). Losses: measured up to 1.3e-7 relative. Grad norms of step 1 (the same
# weights): up to 1.1e-6 at ZeRO-1, where both take the norm of fp32 shards in fp32. After it the
# weights differ a little: AdamW's first updates are +-lr per element whatever the gradient's size,
# so an element whose gradient is rounding noise moves by +lr on one side and -lr on the other
# (measured 6.2e-6 at step 3 with lr 0.01).
LOSS_RTOL = 1e-6
FIRST_GRAD_NORM_RTOL = 1e-5
GRAD_NORM_RTOL = 5e-5

STEP_FIELDS = ["step", "loss", "grad_norm", "lr", "tokens", "valid_tokens", "step_ms",
               "tokens_per_s", "tokens_per_s_per_rank", "peak_mem_bytes", "peak_host_bytes",
               "first_sample", "phases"]
SUMMARY_FIELDS = ["steps", "measured_steps", "warmup_steps", "step_ms_median",
                  "tokens_per_s_median", "tokens_per_s_per_rank_median", "phases_ms_median",
                  "peak_mem_bytes",
                  "peak_host_bytes", "max_rank_peak_mem_bytes", "max_rank_peak_host_bytes",
                  "first_loss", "final_loss", "world_size", "dp", "sp", "sequence_length",
                  "device", "memory", "backend", "versions", "workarounds", "weights"]

# name, ranks, sp, the run config's sequence/memory/zero (flow YAML), started by torchrun (else as a
# sweep starts ranks), what summary.json must say
CASES = [
    ("sp2dp2-mb2-ga2-tiled", 4, 2,
     "sequence: {micro_batch: 2, grad_accum: 2}\n  memory: {tiled_mlp: 2, tiled_loss: 2}", True,
     {"checkpointing": False, "workarounds": ["labels", "tiled loss", "loss"]}),
    ("sp2dp1-offload-zero1", 2, 2,
     "sequence: {grad_accum: 2}\n  memory: {checkpointing: true, offload_activations: true}\n"
     "  zero: {stage: 1}", False,
     {"checkpointing": True, "workarounds": ["loss"]}),
    ("sp2dp1-zero3-ga2-tiled", 2, 2,
     "sequence: {grad_accum: 2}\n  memory: {tiled_mlp: 2, tiled_loss: 2}\n  zero: {stage: 3}", True,
     {"checkpointing": False, "workarounds": ["tiled loss", "loss", "zero-3 gradients"]}),
    ("sp1dp2-zero2-mb2", 2, 1, "sequence: {micro_batch: 2}\n  zero: {stage: 2}", False,
     {"checkpointing": False, "workarounds": []}),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def native_trial(tmp, tune, name, world, sp, run_config):
    """One ulysses-train trial of `run_config` as a sweep; returns (db, trial id, run dir)."""
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        f.write(f"""name: {name}
hardware: cpu-local
world_size: {world}
memory_limit_gib: 4.0
backend: native
base:
  model: {{load: {tmp}/model}}
  data: {{source: "tokens:{tmp}/tokens.bin"}}
  {run_config}
  train: {{device: cpu}}
  optim: {{lr: 0.01}}
  comm: {{timeout_s: 120, collective_timeout_s: 120}}
space:
  mesh.sp: [{sp}]
  sequence.length: [64]
objective: throughput
budget: {{trial_timeout_s: 300}}
trial: {{warmup_steps: 1, steps: 2}}
search: {{method: grid, probe: false, prune: false}}
""")
    db = os.path.join(tmp, name + ".db")
    subprocess.run([tune, "sweep", path, "--db", db, "--name", name], cwd=tmp, check=True,
                   stdout=subprocess.DEVNULL)
    trial, status, run_dir = sqlite3.connect(db).execute(
        "SELECT id, status, run_dir FROM trials ORDER BY id").fetchone()
    if status != "ok":
        raise SystemExit(f"{name}: the ulysses-train trial is {status}")
    return db, trial, os.path.join(tmp, run_dir) if not os.path.isabs(run_dir) else run_dir


def run_ds_trial(run_yaml, ds_config, out_dir, world, torchrun):
    """ds_trial.py on `world` ranks writing to out_dir: under torchrun as a user starts it, or as a
    sweep does, one process per rank with the environment torchrun gives. Returns (exit status of
    each rank or of torchrun, stderr)."""
    with open(run_yaml) as f:
        run = yaml.safe_load(f)
    run["output"]["dir"] = out_dir
    config = out_dir + ".yaml"
    with open(config, "w") as f:
        yaml.safe_dump(run, f)
    program = [DS_TRIAL, "--config", config, "--ds-config", ds_config]
    port = str(free_port())
    if torchrun:
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                               str(world), "--master-addr", "127.0.0.1", "--master-port", port] +
                              program, capture_output=True, text=True)
        return [proc.returncode], proc.stderr
    ranks = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port)
        ranks.append(subprocess.Popen([sys.executable] + program, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    stderr = [rank.communicate()[1] for rank in ranks]
    return [rank.returncode for rank in ranks], "".join(stderr)


def records(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "step" in r]


def relative(a, b):
    return abs(a - b) / max(abs(a), abs(b))


def check_case(tmp, tune, case, failures):
    name, world, sp, run_config, torchrun, expect = case
    db, trial, run_dir = native_trial(tmp, tune, name, world, sp, run_config)
    ds_config = os.path.join(tmp, name + "-ds_config.json")
    subprocess.run([tune, "export", "--db", db, "--trial", str(trial), "--format", "deepspeed",
                    "--out", ds_config], check=True, capture_output=True)
    out_dir = os.path.join(tmp, name + "-deepspeed")
    codes, stderr = run_ds_trial(os.path.join(run_dir, "run.yaml"), ds_config, out_dir, world,
                                 torchrun)
    if any(codes):
        failures.append(f"{name}: ds_trial.py exit {codes}: {stderr[-2000:]}")
        return
    ours, theirs = records(os.path.join(run_dir, "out")), records(out_dir)
    if len(ours) != len(theirs) or not ours:
        failures.append(f"{name}: {len(ours)} ulysses-train steps, {len(theirs)} deepspeed steps")
        return
    for a, b in zip(ours, theirs):
        if a["first_sample"] != b["first_sample"]:
            failures.append(f"{name} step {a['step']}: first sample {a['first_sample']} vs "
                            f"{b['first_sample']}")
        if relative(a["loss"], b["loss"]) > LOSS_RTOL:
            failures.append(f"{name} step {a['step']}: loss {a['loss']!r} vs {b['loss']!r}")
        rtol = FIRST_GRAD_NORM_RTOL if a["step"] == 1 else GRAD_NORM_RTOL
        if relative(a["grad_norm"], b["grad_norm"]) > rtol:
            failures.append(f"{name} step {a['step']}: grad norm {a['grad_norm']!r} vs "
                            f"{b['grad_norm']!r}")
        missing = [k for k in STEP_FIELDS if k not in b]
        if missing:
            failures.append(f"{name}: metrics.jsonl lacks {missing}")
        elif not all(b["phases"].get(p, 0) > 0 for p in ("forward", "loss", "backward",
                                                          "optimizer")):
            failures.append(f"{name} step {b['step']}: phases {b['phases']}")
    with open(os.path.join(out_dir, "summary.json")) as f:
        summary = json.load(f)
    missing = [k for k in SUMMARY_FIELDS if k not in summary]
    if missing:
        failures.append(f"{name}: summary.json lacks {missing}")
    if summary.get("memory", {}).get("checkpointing") != expect["checkpointing"]:
        failures.append(f"{name}: summary memory.checkpointing is "
                        f"{summary.get('memory', {}).get('checkpointing')}")
    for prefix in expect["workarounds"]:
        if not any(w.startswith(prefix + ":") for w in summary.get("workarounds", [])):
            failures.append(f"{name}: summary.json names no '{prefix}' workaround")
    print(f"{name}: {len(ours)} steps, max rel diff loss "
          f"{max(relative(a['loss'], b['loss']) for a, b in zip(ours, theirs)):.1e}, grad norm "
          f"{max(relative(a['grad_norm'], b['grad_norm']) for a, b in zip(ours, theirs)):.1e}")
    return run_dir


def check_bad_input(tmp, run_yaml, ds_config, failures):
    """Keys ds_trial.py cannot run: one line naming the key, exit 2, before any rank meets."""
    with open(run_yaml) as f:
        base = yaml.safe_load(f)
    heads = int(base["model"]["num_heads"])
    uneven_sp = next((sp for sp in range(2, heads) if heads % sp), heads + 1)  # not a divisor
    for key, changes in (("data.source", {"data.source": "megatron:/data/corpus"}),
                         ("data.pack", {"data.pack": True}),
                         ("mesh.uneven_heads", {"mesh.uneven_heads": True, "mesh.sp": uneven_sp})):
        run = json.loads(json.dumps(base))
        for changed, value in changes.items():
            section, field = changed.split(".")
            run[section][field] = value
        path = os.path.join(tmp, f"bad-{key.split('.')[1]}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(run, f)
        proc = subprocess.run([sys.executable, DS_TRIAL, "--config", path, "--ds-config",
                               ds_config], capture_output=True, text=True)
        lines = proc.stderr.strip().split("\n")
        if proc.returncode != 2 or len(lines) != 1 or not lines[0].startswith(f"error: {key}: "):
            failures.append(f"bad {key}: exit {proc.returncode}, stderr {proc.stderr!r}")
        print(f"bad {key}: exit {proc.returncode}, {lines[-1]}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", required=True, help="directory of ulysses-tune and ulysses-train")
    args = p.parse_args()
    tune = os.path.join(args.bin, "ulysses-tune")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        make_model(os.path.join(tmp, "model"))
        rng = np.random.default_rng(7)
        rng.integers(0, 512, size=64 * 64, dtype=np.uint16).astype("<u2").tofile(
            os.path.join(tmp, "tokens.bin"))
        run_dirs = [check_case(tmp, tune, case, failures) for case in CASES]
        if run_dirs[0]:
            check_bad_input(tmp, os.path.join(run_dirs[0], "run.yaml"),
                            os.path.join(tmp, CASES[0][0] + "-ds_config.json"), failures)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
