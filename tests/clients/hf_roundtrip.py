#!/usr/bin/env python3
"""Real-client round trip with Hugging Face transformers.

Forward direction: ulysses-train trains a small Llama on a flat uint16 token file and writes HF
checkpoints (initial/, step-1/, step-2/); transformers' LlamaForCausalLM.from_pretrained loads
each and computes the loss of the batch that ulysses-train computed with those weights:
  step 1 loss  == HF(initial)  on samples [0, G)
  step 2 loss  == HF(step-1)   on samples [G, 2G)      (checks the optimizer update too)
  eval loss    == HF(step-2)   on the eval file's samples [0, dp * micro_batch)
Reverse direction: transformers initialises LlamaForCausalLM(LlamaConfig(...)) with a seed and
save_pretrained()s it; ulysses-train loads it (model.load) and its step-1 loss and grad_norm must
equal transformers' on the same tokens; after one torch.optim.AdamW step (with clip_grad_norm_)
transformers' step-2 loss must equal ulysses-train's step-2 loss.

Sample i of a flat file is tokens [i*L, (i+1)*L); labels are the next token within the sample,
the last position ignored; the loss is the mean cross-entropy over every valid label of the
global batch, which is what transformers computes with labels=input_ids.

  hf_roundtrip.py --bin BUILD/bin --case forward_untied [--keep]
Exit status 0 when every comparison holds; otherwise 1 with both numbers printed.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

LOSS_RTOL = 1e-5   # relative 1e-5 on the loss (fp32)
NORM_RTOL = 1e-4   # gradients are held to 1e-4

# Model shapes per case, in the run config's `model:` keys (tiny: each case runs in seconds).
# init_std 0.1 (not HF's 0.02): attention scores then have a standard deviation of about 1, so
# the loss depends on RoPE and the attention pattern (at 0.02 attention is almost uniform and a
# wrong rope_theta moves the step-1 loss by less than 1e-5).
SMALL = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4, head_dim=16,
             intermediate_size=128, vocab_size=256, rope_theta=10000.0, rms_norm_eps=1.0e-5,
             init_std=0.1)
GQA = dict(hidden_size=128, num_layers=2, num_heads=8, num_kv_heads=2, head_dim=16,
           intermediate_size=256, vocab_size=512, rope_theta=10000.0, rms_norm_eps=1.0e-5,
           init_std=0.1)
LLAMA3_ROPE = dict(rope_theta=500000.0, rope_scaling_type="llama3", rope_scaling_factor=8.0,
                   rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                   rope_original_max_position=32)

# case -> (direction, model keys, run-config overrides)
CASES = {
    "forward_untied": ("forward", dict(SMALL, tie_embeddings=False), {}),
    "forward_tied": ("forward", dict(SMALL, tie_embeddings=True, vocab_size=384), {}),
    "forward_gqa": ("forward", dict(GQA, tie_embeddings=False), {"length": 128}),
    "forward_rope_llama3": ("forward", dict(GQA, tie_embeddings=False, **LLAMA3_ROPE),
                            {"length": 128}),
    # sp 2 over 2 ranks; length 127 is padded to 128 with an ignored label.
    "forward_sp2": ("forward", dict(GQA, tie_embeddings=False), {"length": 127, "sp": 2}),
    "reverse_untied": ("reverse", dict(SMALL, tie_embeddings=False), {}),
    "reverse_tied": ("reverse", dict(SMALL, tie_embeddings=True, vocab_size=384), {}),
    "reverse_gqa": ("reverse", dict(GQA, tie_embeddings=False), {"length": 128}),
    # transformers 5 writes rope_theta / rope scaling inside config.json's "rope_parameters".
    "reverse_rope_llama3": ("reverse", dict(GQA, tie_embeddings=False, **LLAMA3_ROPE),
                            {"length": 128}),
}

LR = 1.0e-2
BETAS = (0.9, 0.95)
EPS = 1.0e-8
WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0
MICRO_BATCH = 2
STEPS = 2


class Mismatch(Exception):
    pass


FAILURES = []  # comparisons that failed; the case goes on to print the others, then fails


def log(msg):
    print(msg, flush=True)


def write_tokens(path, num_tokens, vocab_size, seed):
    rng = np.random.default_rng(seed)
    rng.integers(0, vocab_size, size=num_tokens, dtype=np.uint16).astype("<u2").tofile(path)


def read_samples(path, length, first, count):
    """Samples [first, first + count) of a flat uint16 file, as a [count, length] LongTensor."""
    tokens = np.fromfile(path, dtype="<u2")
    rows = [tokens[i * length:(i + 1) * length] for i in range(first, first + count)]
    return torch.from_numpy(np.stack(rows).astype(np.int64))


def yaml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a YAML string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    return repr(value)


def yaml_section(name, fields):
    return name + ": {" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in fields.items()) + "}\n"


def write_run_config(path, work, model, length, sp, tokens, eval_tokens):
    text = "# written by tests/clients/hf_roundtrip.py\n"
    text += yaml_section("model", model)
    text += yaml_section("mesh", {"sp": sp, "dp": 1})
    text += yaml_section("sequence", {"length": length, "micro_batch": MICRO_BATCH,
                                      "grad_accum": 1})
    text += yaml_section("data", {"source": "tokens:" + tokens, "token_dtype": "uint16"})
    text += yaml_section("optim", {"lr": LR, "betas": list(BETAS), "eps": EPS,
                                   "weight_decay": WEIGHT_DECAY, "grad_clip": GRAD_CLIP,
                                   "warmup_steps": 0, "schedule": "constant"})
    text += yaml_section("train", {"steps": STEPS, "seed": 0, "device": "cpu"})
    text += yaml_section("checkpoint", {"dir": os.path.join(work, "ckpt"), "every": 1,
                                        "save_initial": True})
    text += yaml_section("output", {"dir": os.path.join(work, "out")})
    if eval_tokens:
        text += yaml_section("eval", {"source": "tokens:" + eval_tokens, "every": 0, "steps": 1})
    with open(path, "w") as f:
        f.write(text)
    return text


def run_trainer(bindir, config_path, sp, work):
    if sp == 1:
        cmd = [os.path.join(bindir, "ulysses-train"), "--config", config_path]
    else:
        cmd = [os.path.join(bindir, "ulysses-tune"), "launch", config_path, "--nproc", str(sp)]
    if not os.access(cmd[0], os.X_OK):
        raise Mismatch(f"{cmd[0]}: not found or not executable (build it first)")
    log("$ " + " ".join(cmd))
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    sys.stdout.write(proc.stdout[-4000:])
    if proc.returncode != 0:
        sys.stdout.write(proc.stderr[-4000:])
        raise Mismatch(f"{cmd[0]} exited with status {proc.returncode}")


def read_metrics(out_dir):
    steps, evals = {}, []
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        for line in f:
            if not line.strip():
                continue
            record = json.loads(line)
            if "eval" in record:
                evals.append(record["eval"])
            elif "step" in record:
                steps[int(record["step"])] = record
    return steps, evals


def hf_model(model_dir):
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                             attn_implementation="eager")
    model.eval()
    return model


def hf_loss(model, input_ids):
    """transformers' own causal-LM loss: labels=input_ids, shifted inside, mean over the batch."""
    with torch.no_grad():
        return model(input_ids=input_ids, labels=input_ids).loss.item()


def compare(what, ours, theirs, rtol):
    rel = abs(ours - theirs) / max(abs(theirs), 1e-30)
    ok = math.isfinite(ours) and math.isfinite(theirs) and rel <= rtol
    log(f"{'ok  ' if ok else 'FAIL'} {what}: ulysses-train {ours:.9g}  transformers {theirs:.9g}  "
        f"rel diff {rel:.2e} (tolerance {rtol:.0e})")
    if not ok:
        FAILURES.append(f"{what}: ulysses-train {ours!r} != transformers {theirs!r} "
                        f"(rel {rel:.3e} > {rtol:.0e})")


def check_config(ckpt, model_keys):
    """transformers' reading of the checkpoint's config.json has the shapes we trained (for the
    reverse direction: those transformers wrote, as ulysses-train read them)."""
    cfg = LlamaConfig.from_pretrained(ckpt)
    name = os.path.join(os.path.basename(os.path.dirname(ckpt)), os.path.basename(ckpt))
    expect = {"hidden_size": model_keys["hidden_size"],
              "num_hidden_layers": model_keys["num_layers"],
              "num_attention_heads": model_keys["num_heads"],
              "num_key_value_heads": model_keys["num_kv_heads"],
              "head_dim": model_keys["head_dim"],
              "intermediate_size": model_keys["intermediate_size"],
              "vocab_size": model_keys["vocab_size"],
              "tie_word_embeddings": model_keys["tie_embeddings"]}
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    got = {key: getattr(cfg, key) for key in expect}
    got["rope_theta"] = rope.get("rope_theta")
    got["rope_type"] = rope.get("rope_type", "default")
    expect["rope_theta"] = model_keys["rope_theta"]
    expect["rope_type"] = model_keys.get("rope_scaling_type") or "default"
    if expect["rope_type"] != "default":
        for ours, theirs in [("rope_scaling_factor", "factor"),
                             ("rope_low_freq_factor", "low_freq_factor"),
                             ("rope_high_freq_factor", "high_freq_factor"),
                             ("rope_original_max_position", "original_max_position_embeddings")]:
            expect[theirs] = model_keys[ours]
            got[theirs] = rope.get(theirs)
    for key, value in expect.items():
        ok = got[key] == value
        log(f"{'ok  ' if ok else 'FAIL'} {name}/config.json as transformers reads it: "
            f"{key} = {got[key]!r} (expected {value!r})")
        if not ok:
            FAILURES.append(f"{name}/config.json: transformers reads {key} = {got[key]!r}, "
                            f"expected {value!r}")


def forward_case(args, work, model_keys, opts):
    length, sp = opts.get("length", 64), opts.get("sp", 1)
    vocab = model_keys["vocab_size"]
    g = MICRO_BATCH  # dp 1: G = dp * micro_batch * grad_accum
    tokens = os.path.join(work, "train.u16")
    eval_tokens = os.path.join(work, "eval.u16")
    write_tokens(tokens, (STEPS * g + 1) * length, vocab, seed=11)
    write_tokens(eval_tokens, (g + 1) * length, vocab, seed=12)
    config_path = os.path.join(work, "run.yaml")
    log(write_run_config(config_path, work, model_keys, length, sp, tokens, eval_tokens))
    run_trainer(args.bin, config_path, sp, work)
    steps, evals = read_metrics(os.path.join(work, "out"))
    if sorted(steps) != list(range(1, STEPS + 1)):
        raise Mismatch(f"metrics.jsonl has steps {sorted(steps)}, expected 1..{STEPS}")

    ckpt = os.path.join(work, "ckpt")
    check_config(os.path.join(ckpt, "initial"), model_keys)
    for step, weights in [(1, "initial"), (2, "step-1")]:
        model = hf_model(os.path.join(ckpt, weights))
        batch = read_samples(tokens, length, (step - 1) * g, g)
        compare(f"step {step} loss (HF loads {weights}/, samples [{(step - 1) * g}, {step * g}))",
                steps[step]["loss"], hf_loss(model, batch), LOSS_RTOL)
    if not evals:
        raise Mismatch("metrics.jsonl has no eval record")
    model = hf_model(os.path.join(ckpt, f"step-{STEPS}"))
    compare(f"eval loss after step {STEPS} (HF loads step-{STEPS}/, eval samples [0, {g}))",
            evals[-1]["loss"], hf_loss(model, read_samples(eval_tokens, length, 0, g)), LOSS_RTOL)


def hf_config(model_keys):
    rope = {"rope_type": "default", "rope_theta": model_keys["rope_theta"]}
    if model_keys.get("rope_scaling_type"):
        rope = {"rope_type": model_keys["rope_scaling_type"],
                "rope_theta": model_keys["rope_theta"],
                "factor": model_keys["rope_scaling_factor"],
                "low_freq_factor": model_keys["rope_low_freq_factor"],
                "high_freq_factor": model_keys["rope_high_freq_factor"],
                "original_max_position_embeddings": model_keys["rope_original_max_position"]}
    return LlamaConfig(hidden_size=model_keys["hidden_size"],
                       num_hidden_layers=model_keys["num_layers"],
                       num_attention_heads=model_keys["num_heads"],
                       num_key_value_heads=model_keys["num_kv_heads"],
                       head_dim=model_keys["head_dim"],
                       intermediate_size=model_keys["intermediate_size"],
                       vocab_size=model_keys["vocab_size"],
                       rms_norm_eps=model_keys["rms_norm_eps"],
                       tie_word_embeddings=model_keys["tie_embeddings"],
                       rope_parameters=rope,
                       initializer_range=model_keys["init_std"],
                       max_position_embeddings=4096)


def reverse_case(args, work, model_keys, opts):
    length = opts.get("length", 64)
    g = MICRO_BATCH
    tokens = os.path.join(work, "train.u16")
    write_tokens(tokens, (STEPS * g + 1) * length, model_keys["vocab_size"], seed=21)

    torch.manual_seed(1234)
    model = LlamaForCausalLM(hf_config(model_keys)).to(torch.float32)
    hf_dir = os.path.join(work, "hf-init")
    model.save_pretrained(hf_dir, safe_serialization=True)
    log("transformers wrote " + hf_dir + ": " + ", ".join(sorted(os.listdir(hf_dir))))
    with open(os.path.join(hf_dir, "config.json")) as f:
        log(f.read())

    config_path = os.path.join(work, "run.yaml")
    log(write_run_config(config_path, work, {"load": hf_dir}, length, 1, tokens, None))
    run_trainer(args.bin, config_path, 1, work)
    steps, _ = read_metrics(os.path.join(work, "out"))

    # transformers' own step: loss, gradients, clip_grad_norm_, torch.optim.AdamW.
    model.train()  # no dropout in Llama (attention_dropout 0); train() only for the autograd run
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    batch = read_samples(tokens, length, 0, g)
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP).item()
    compare("step 1 loss (ulysses-train loads transformers' save_pretrained)",
            steps[1]["loss"], loss.item(), LOSS_RTOL)
    compare("step 1 grad_norm (before clipping)", steps[1]["grad_norm"], grad_norm, NORM_RTOL)
    optimizer.step()
    optimizer.zero_grad()
    batch = read_samples(tokens, length, g, g)
    with torch.no_grad():
        loss2 = model(input_ids=batch, labels=batch).loss.item()
    compare("step 2 loss (after one clip + torch.optim.AdamW step on each side)",
            steps[2]["loss"], loss2, LOSS_RTOL)
    # ulysses-train's checkpoint of the loaded model says what it trained: the shapes and RoPE
    # transformers wrote.
    check_config(os.path.join(work, "ckpt", "initial"), model_keys)
    # And transformers reads back what ulysses-train wrote from the loaded model.
    compare("step 1 loss, HF reloading ulysses-train's initial/ checkpoint",
            steps[1]["loss"], hf_loss(hf_model(os.path.join(work, "ckpt", "initial")),
                                      read_samples(tokens, length, 0, g)), LOSS_RTOL)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", required=True, help="directory holding ulysses-train")
    parser.add_argument("--case", required=True, choices=sorted(CASES))
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    log(f"transformers {transformers.__version__}, torch {torch.__version__}, case {args.case}")

    direction, model_keys, opts = CASES[args.case]
    work = tempfile.mkdtemp(prefix=f"hf_roundtrip_{args.case}_")
    ok = False
    try:
        (forward_case if direction == "forward" else reverse_case)(args, work, model_keys, opts)
        if FAILURES:
            raise Mismatch(f"{len(FAILURES)} comparison(s) failed:\n  " + "\n  ".join(FAILURES))
        ok = True
    except Mismatch as e:
        log(f"FAILED {args.case}: {e}")
    finally:
        if ok and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"work directory kept: {work}")
    if ok:
        log(f"PASSED {args.case}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
