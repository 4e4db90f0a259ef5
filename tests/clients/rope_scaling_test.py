#!/usr/bin/env python3
"""RoPE scaling (yarn, linear, dynamic) held to transformers' own Qwen2 training.

For a case, transformers makes a tiny Qwen2ForCausalLM(Qwen2Config(..., rope scaling)) (fp32,
seeded, norms and biases moved off their init) whose RoPE scaling matters over the trained
sequence of 64 tokens (yarn and linear: original_max_position_embeddings 16, factor 4), and
save_pretrained writes it. ulysses-train loads it (model.load) and trains 3 steps at sp 1 and at
sp 2 (two ranks, each rotating its shard at global positions); transformers trains the same
checkpoint in float64 on the same samples (torch.optim.AdamW, clip_grad_norm_); every step's loss
and grad norm must match to families_test.py's tolerances (loss rel 1e-5, grad norm rel 1e-4).

The test shows that it can see what it checks: transformers' step-1 loss with the scaling taken
out (plain RoPE), and for yarn with the attention factor taken out (cos/sin not multiplied by it),
must differ from the real one by more than 10 times the loss tolerance, so an implementation
that dropped either would fail the comparison.

ulysses-train's checkpoint of the loaded model (initial/) must load in transformers with the same
RoPE: the rotary embedding transformers builds from our config.json has the source's inv_freq and
attention_scaling, bit for bit, and the same logits.

Cases:
  yarn         Qwen2.5's long-context form: config.json's legacy "rope_scaling": {"type": "yarn",
               "factor": 4.0, "original_max_position_embeddings": 16} and a top-level rope_theta.
  yarn_params  "rope_parameters" as transformers 5 writes it, with beta_fast/beta_slow, mscale /
               mscale_all_dim and truncate false (a ramp of fractional dims); plus the run-config
               keys alone (no model.load): ulysses-train's step-1 loss equals transformers' on the
               checkpoint ulysses-train wrote.
  linear       "rope_scaling": {"type": "linear", "factor": 4.0}.
  dynamic      transformers' dynamic NTK with max_position_embeddings 64 = the sequence (below it
               transformers leaves RoPE unscaled, and so does ulysses-train);
               max_position_embeddings 32 is refused (exit 2, one line naming model.rope_scaling_type, no metrics), by
               ulysses-train and by `ulysses-tune launch` for 2 ranks.

  rope_scaling_test.py --bin BUILD/bin --case yarn [--keep]
Exit status 0 when every comparison holds; otherwise 1 with both numbers printed.
"""
import json
import os
import sys
import time

import torch
import transformers

import hf_common
from hf_common import (BETAS, EPS, LR, WEIGHT_DECAY, GRAD_CLIP, Mismatch, causal_lm_loss,
                       load_hf_model, log, make_hf_model, optim_section, read_metrics,
                       read_samples, run_trainer, write_run_config, write_tokens)

# families_test.py's tolerances and measurements apply: ulysses-train in fp32 against
# transformers in fp64 differs by its own rounding only.
LOSS_RTOL = 1e-5
NORM_RTOL = 1e-4
# Taking the scaling or yarn's attention factor out must move transformers' step-1 loss by more
# than this many loss tolerances (measured: plain RoPE instead of yarn 2.6e-3, yarn without its
# attention factor 6.4e-4, i.e. 64 tolerances; ulysses-train is within 3e-7 of transformers).
SENSITIVITY = 10

SEQ_LEN = 64
MICRO_BATCH = 2
STEPS = 3

# Qwen2 as families_test.py's (q/k/v biases, tied head), 4 query heads over 2 KV heads, hd 16.
MODEL = dict(family="qwen2", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
             head_dim=16, intermediate_size=128, vocab_size=256, rope_theta=1.0e6,
             rms_norm_eps=1.0e-6, init_std=0.1, tie_embeddings=True)

# case -> (rope_theta, transformers config keyword arguments, config.json rewrite or None)
CASES = {
    "yarn": (1.0e6, dict(max_position_embeddings=SEQ_LEN,
                         rope_scaling={"type": "yarn", "factor": 4.0,
                                       "original_max_position_embeddings": 16}),
             "legacy"),
    "yarn_params": (100.0, dict(max_position_embeddings=SEQ_LEN,
                                rope_parameters={"rope_type": "yarn", "rope_theta": 100.0,
                                                 "factor": 3.0,
                                                 "original_max_position_embeddings": 32,
                                                 "beta_fast": 8.0, "beta_slow": 0.5,
                                                 "mscale": 1.5, "mscale_all_dim": 0.5,
                                                 "truncate": False}),
                    None),
    "linear": (1.0e4, dict(max_position_embeddings=SEQ_LEN,
                           rope_scaling={"type": "linear", "factor": 4.0}), "legacy"),
    "dynamic": (1.0e4, dict(max_position_embeddings=SEQ_LEN,
                            rope_scaling={"type": "dynamic", "factor": 4.0}), "legacy"),
}

FAILURES = []


def compare(what, ours, theirs, rtol):
    return hf_common.compare(FAILURES, what, ours, theirs, rtol)


def check(ok, what):
    log(f"{'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        FAILURES.append(what)


def make_source(work, case, name="hf-init", **overrides):
    """transformers' Qwen2 with the case's RoPE, saved; config.json rewritten to the legacy
    "rope_scaling" + top-level "rope_theta" form (as Qwen2.5's model cards give it) when the case
    says so. Returns (model, dir)."""
    theta, kwargs, form = CASES[case]
    kwargs = dict(kwargs, **overrides)
    keys = dict(MODEL, rope_theta=theta)
    model = make_hf_model(keys, seed=1234, perturb_seed=77, rope_theta=theta, **kwargs)
    hf_dir = os.path.join(work, name)
    model.save_pretrained(hf_dir, safe_serialization=True)
    path = os.path.join(hf_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    if form == "legacy":
        rope = config.pop("rope_parameters")
        config["rope_theta"] = rope.pop("rope_theta")
        rope.pop("rope_type", None)
        config["rope_scaling"] = rope  # {"type": ..., "factor": ..., ...}
        with open(path, "w") as f:
            json.dump(config, f, indent=2)
    with open(path) as f:
        log(f"transformers {type(model).__name__} wrote {hf_dir}/config.json:\n" + f.read())
    return model, hf_dir


def train_reference(hf_dir, tokens, dtype, steps=STEPS, patch=None):
    """transformers trains its checkpoint as families_test.py's reference does: per step the loss
    and the grad norm before clipping. `patch(model)` changes the model first (the sensitivity
    checks)."""
    model = load_hf_model(hf_dir, dtype=dtype)
    if patch is not None:
        patch(model)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    losses, norms = [], []
    for step in range(steps):
        batch = read_samples(tokens, SEQ_LEN, step * MICRO_BATCH, MICRO_BATCH)
        loss = causal_lm_loss(model(input_ids=batch).logits, batch)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP).item())
        losses.append(loss.item())
        optimizer.step()
        optimizer.zero_grad()
    return losses, norms


def unscaled_rope(model):
    """The rotary embedding of plain RoPE (no scaling, no attention factor)."""
    rotary = model.model.rotary_emb
    inv_freq, _ = rotary.compute_default_rope_parameters(model.config)
    rotary.inv_freq = inv_freq.to(rotary.inv_freq.device)
    rotary.original_inv_freq = rotary.inv_freq.clone()
    rotary.rope_type = "default"
    rotary.attention_scaling = 1.0


def no_attention_factor(model):
    model.model.rotary_emb.attention_scaling = 1.0


def sensitivity(case, hf_dir, tokens, ref_loss):
    """transformers' step-1 loss without the scaling (and for yarn without its attention factor)
    differs from the real one by more than SENSITIVITY loss tolerances."""
    variants = [("plain RoPE instead of " + case, unscaled_rope)]
    if case.startswith("yarn"):
        variants.append(("yarn without its attention factor", no_attention_factor))
    for what, patch in variants:
        loss = train_reference(hf_dir, tokens, torch.float64, steps=1, patch=patch)[0][0]
        rel = abs(loss - ref_loss) / abs(ref_loss)
        check(rel > SENSITIVITY * LOSS_RTOL,
              f"{case}: transformers' step-1 loss with {what} is {loss:.9g}, rel diff {rel:.2e} "
              f"from the real {ref_loss:.9g} (must exceed {SENSITIVITY * LOSS_RTOL:.0e} for the "
              "comparison to see it)")


def run_sections(work, name, model_section, tokens, sp, steps=STEPS):
    return {
        "model": model_section,
        "mesh": {"sp": sp, "dp": 1},
        "sequence": {"length": SEQ_LEN, "micro_batch": MICRO_BATCH, "grad_accum": 1},
        "data": {"source": "tokens:" + tokens, "token_dtype": "uint16"},
        "optim": optim_section(),
        "train": {"steps": steps, "seed": 0, "device": "cpu"},
        "comm": {"timeout_s": 120, "collective_timeout_s": 120},
        "output": {"dir": os.path.join(work, name, "out")},
    }


def train_ours(args, work, name, sections, sp):
    """Runs ulysses-train; returns {step: record} or None (the failure recorded)."""
    run_dir = os.path.join(work, name)
    os.makedirs(run_dir, exist_ok=True)
    config_path = os.path.join(run_dir, "run.yaml")
    log(write_run_config(config_path, sections, "tests/clients/rope_scaling_test.py"))
    try:
        run_trainer(args.bin, config_path, sp, run_dir, quiet=True)
    except Mismatch as e:
        FAILURES.append(f"{name}: {e}")
        log(f"FAIL {name}: {e}")
        return None
    steps, _ = read_metrics(sections["output"]["dir"])
    return steps


def rotary_of(model_dir):
    """transformers' rotary embedding built from model_dir/config.json."""
    config = transformers.AutoConfig.from_pretrained(model_dir)
    model_class = hf_common.FAMILIES[config.model_type][1]
    module = sys.modules[model_class.__module__]
    rotary_class = next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding"))
    return config, rotary_class(config)


def check_written_config(case, source_dir, ckpt_dir, tokens):
    """transformers builds the same rotary embedding from our config.json as from the source's,
    and the loaded checkpoint gives the source model's logits."""
    source_config, theirs = rotary_of(source_dir)
    ours_config, ours = rotary_of(ckpt_dir)
    check(ours_config.rope_parameters.get("rope_type") == source_config.rope_parameters.get(
        "rope_type"), f"{case}: {ckpt_dir}/config.json rope_type "
        f"{ours_config.rope_parameters.get('rope_type')!r} (source "
        f"{source_config.rope_parameters.get('rope_type')!r})")
    check(torch.equal(ours.inv_freq, theirs.inv_freq),
          f"{case}: transformers' inv_freq from our config.json equals the source's bit for bit")
    check(ours.attention_scaling == theirs.attention_scaling,
          f"{case}: transformers' attention_scaling from our config.json "
          f"{ours.attention_scaling!r} (source {theirs.attention_scaling!r})")
    batch = read_samples(tokens, SEQ_LEN, 0, MICRO_BATCH)
    with torch.no_grad():
        ours_logits = load_hf_model(ckpt_dir, expect_family="qwen2")(input_ids=batch).logits
        theirs_logits = load_hf_model(source_dir, expect_family="qwen2")(input_ids=batch).logits
    check(torch.equal(ours_logits, theirs_logits),
          f"{case}: transformers' logits of our initial checkpoint equal the source model's")


def refused_case(args, work, tokens):
    """dynamic with max_position_embeddings below the sequence: refused before any rank starts."""
    _, hf_dir = make_source(work, "dynamic", name="hf-short", max_position_embeddings=SEQ_LEN // 2)
    for nproc in (1, 2):
        name = f"dynamic-refused-{nproc}"
        run_dir = os.path.join(work, name)
        os.makedirs(run_dir)
        sections = run_sections(work, name, {"load": hf_dir}, tokens, nproc, steps=1)
        config_path = os.path.join(run_dir, "run.yaml")
        write_run_config(config_path, sections, "tests/clients/rope_scaling_test.py")
        problems = hf_common.refused_run_problems(args.bin, config_path, sections, nproc, run_dir,
                                                  "model.rope_scaling_type")
        what = (f"dynamic scaling, max_position_embeddings {SEQ_LEN // 2} < sequence.length "
                f"{SEQ_LEN}, {nproc} rank(s)")
        check(not problems, what + ": refused" + (": " + "; ".join(problems) if problems else ""))


def inline_keys_case(args, work, tokens):
    """yarn from the run-config keys alone: ulysses-train's step-1 loss equals transformers' on
    the checkpoint ulysses-train wrote (its config.json carries the same RoPE)."""
    _, kwargs, _ = CASES["yarn_params"]
    rope = kwargs["rope_parameters"]
    model_section = dict(MODEL, rope_theta=rope["rope_theta"], rope_scaling_type="yarn",
                         rope_scaling_factor=rope["factor"],
                         rope_original_max_position=rope["original_max_position_embeddings"],
                         rope_beta_fast=rope["beta_fast"], rope_beta_slow=rope["beta_slow"],
                         rope_mscale=rope["mscale"], rope_mscale_all_dim=rope["mscale_all_dim"],
                         rope_truncate=rope["truncate"], max_position_embeddings=SEQ_LEN)
    name = "inline-keys"
    sections = run_sections(work, name, model_section, tokens, 1, steps=1)
    sections["checkpoint"] = {"dir": os.path.join(work, name, "ckpt"), "save_initial": True}
    steps = train_ours(args, work, name, sections, 1)
    if steps is None:
        return
    initial = os.path.join(work, name, "ckpt", "initial")
    model = load_hf_model(initial, expect_family="qwen2", dtype=torch.float64)
    batch = read_samples(tokens, SEQ_LEN, 0, MICRO_BATCH)
    with torch.no_grad():
        theirs = causal_lm_loss(model(input_ids=batch).logits, batch).item()
    compare("yarn from run-config keys: step-1 loss vs transformers on our initial checkpoint",
            steps[1]["loss"], theirs, LOSS_RTOL)
    _, rotary = rotary_of(initial)
    check(rotary.rope_type == "yarn" and rotary.attention_scaling != 1.0,
          f"yarn from run-config keys: transformers reads rope_type {rotary.rope_type!r}, "
          f"attention_scaling {rotary.attention_scaling!r} from our config.json")


def rope_case(args, work, case):
    tokens = os.path.join(work, "train.u16")
    write_tokens(tokens, (STEPS * MICRO_BATCH + 1) * SEQ_LEN, MODEL["vocab_size"], seed=41)
    _, hf_dir = make_source(work, case)
    _, rotary = rotary_of(hf_dir)
    log(f"transformers' rotary embedding: rope_type {rotary.rope_type!r}, attention_scaling "
        f"{rotary.attention_scaling!r}, inv_freq {rotary.inv_freq.tolist()}")

    t0 = time.monotonic()
    ref_losses, ref_norms = train_reference(hf_dir, tokens, torch.float64)
    log(f"transformers fp64: losses {ref_losses}, grad norms {ref_norms} "
        f"({time.monotonic() - t0:.1f}s)")
    if case != "dynamic":  # below max_position_embeddings dynamic is plain RoPE by design
        sensitivity(case, hf_dir, tokens, ref_losses[0])

    worst = {"loss": 0.0, "grad_norm": 0.0}
    for name, sp in (("sp1", 1), ("sp2", 2)):
        t0 = time.monotonic()
        sections = run_sections(work, name, {"load": hf_dir}, tokens, sp)
        if name == "sp1":
            sections["checkpoint"] = {"dir": os.path.join(work, name, "ckpt"),
                                      "save_initial": True}
        steps = train_ours(args, work, name, sections, sp)
        if steps is None:
            continue
        if sorted(steps) != list(range(1, STEPS + 1)):
            FAILURES.append(f"{case} {name}: metrics.jsonl has steps {sorted(steps)}")
            continue
        for s in range(1, STEPS + 1):
            worst["loss"] = max(worst["loss"], compare(
                f"{case} {name} step {s} loss", steps[s]["loss"], ref_losses[s - 1], LOSS_RTOL))
            worst["grad_norm"] = max(worst["grad_norm"], compare(
                f"{case} {name} step {s} grad_norm (before clipping)", steps[s]["grad_norm"],
                ref_norms[s - 1], NORM_RTOL))
        log(f"{case} {name}: {time.monotonic() - t0:.1f}s")
        if name == "sp1":
            check_written_config(case, hf_dir, os.path.join(work, name, "ckpt", "initial"),
                                 tokens)
    log(f"{case}: worst rel diffs vs transformers fp64: loss {worst['loss']:.2e}, grad_norm "
        f"{worst['grad_norm']:.2e}")
    if case == "dynamic":
        refused_case(args, work, tokens)
    if case == "yarn_params":
        inline_keys_case(args, work, tokens)


def main():
    args = hf_common.parse_case_args(__doc__, CASES)
    return hf_common.run_cases(args, "rope_scaling", lambda work: rope_case(args, work, args.case),
                               FAILURES)


if __name__ == "__main__":
    sys.exit(main())
