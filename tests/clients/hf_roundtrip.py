#!/usr/bin/env python3
"""Real-client round trip with Hugging Face transformers, for each decoder family (Llama, Qwen2,
Qwen3, Mistral: the case's `family`, llama when not named).

Forward direction: ulysses-train trains a small random model of the family (inline `model:` keys)
on a flat uint16 token file and writes HF checkpoints (initial/, step-1/, step-2/);
transformers' AutoModelForCausalLM.from_pretrained loads each as the family's own class (no tensor
missing or unexpected) and computes the loss of the batch that ulysses-train computed with those
weights (ulysses-train starts biases at 0 and norms at 1, as transformers does: step 2 and the eval
see them after an update):
  step 1 loss  == HF(initial)  on samples [0, G)
  step 2 loss  == HF(step-1)   on samples [G, 2G)      (checks the optimizer update too)
  eval loss    == HF(step-2)   on the eval file's samples [0, dp * micro_batch)
Reverse direction: transformers initialises the family's class (LlamaForCausalLM(LlamaConfig(...)),
Qwen3ForCausalLM(Qwen3Config(...)), ...) with a seed (the non-Llama cases also move biases and
norm weights off their init) and save_pretrained()s it; ulysses-train loads it (model.load) and
its step-1 loss and grad_norm must equal transformers' on the same tokens; after one
torch.optim.AdamW step (with clip_grad_norm_) transformers' step-2 loss must equal ulysses-train's
step-2 loss. (families_test.py holds each family to transformers over 3 steps at sp 1, 2 and 4
with the memory features.)
The *_zero3 cases run either direction at zero.stage 3 over several ranks: ulysses-train never
builds the whole model there (each rank draws, or reads from the safetensors files, only its
shards) and streams its checkpoints part by part, and the comparisons are the same.

Sample i of a flat file is tokens [i*L, (i+1)*L); labels are the next token within the sample,
the last position ignored; the loss is the mean cross-entropy over every valid label of the
global batch, which is what transformers computes with labels=input_ids.

  hf_roundtrip.py --bin BUILD/bin --case forward_untied [--keep]
Exit status 0 when every comparison holds; otherwise 1 with both numbers printed.
"""
import os
import sys

import torch
import transformers

import hf_common
from hf_common import (BETAS, EPS, GRAD_CLIP, LR, WEIGHT_DECAY, optim_section,
                       FAMILIES, Mismatch, load_hf_model, log, make_hf_model, read_metrics,
                       read_samples, run_trainer, write_run_config, write_tokens)

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
# The other families: Qwen2 adds q/k/v biases (tied head as in Qwen2.5's small
# models); Qwen3 adds per-head q/k RMSNorm and an explicit head_dim (8 heads * 32 = 256 wide
# attention in a 128 wide model); Mistral is Llama's block (its sliding window: families_test.py).
QWEN2 = dict(SMALL, family="qwen2", num_kv_heads=2, rope_theta=1.0e6, rms_norm_eps=1.0e-6,
             tie_embeddings=True)
QWEN3 = dict(GQA, family="qwen3", head_dim=32, rope_theta=1.0e6, rms_norm_eps=1.0e-6,
             tie_embeddings=False)
MISTRAL = dict(GQA, family="mistral", rope_theta=1.0e6, tie_embeddings=False)

# case -> (direction, model keys, run-config overrides)
CASES = {
    "forward_untied": ("forward", dict(SMALL, tie_embeddings=False), {}),
    "forward_tied": ("forward", dict(SMALL, tie_embeddings=True, vocab_size=384), {}),
    "forward_gqa": ("forward", dict(GQA, tie_embeddings=False), {"length": 128}),
    "forward_rope_llama3": ("forward", dict(GQA, tie_embeddings=False, **LLAMA3_ROPE),
                            {"length": 128}),
    # sp 2 over 2 ranks; length 127 is padded to 128 with an ignored label.
    "forward_sp2": ("forward", dict(GQA, tie_embeddings=False), {"length": 127, "sp": 2}),
    "forward_qwen2": ("forward", QWEN2, {}),
    "forward_qwen3": ("forward", QWEN3, {"length": 128}),
    "forward_mistral": ("forward", MISTRAL, {"length": 128}),
    "reverse_untied": ("reverse", dict(SMALL, tie_embeddings=False), {}),
    "reverse_tied": ("reverse", dict(SMALL, tie_embeddings=True, vocab_size=384), {}),
    "reverse_gqa": ("reverse", dict(GQA, tie_embeddings=False), {"length": 128}),
    # transformers 5 writes rope_theta / rope scaling inside config.json's "rope_parameters".
    "reverse_rope_llama3": ("reverse", dict(GQA, tie_embeddings=False, **LLAMA3_ROPE),
                            {"length": 128}),
    "reverse_qwen2": ("reverse", QWEN2, {}),
    "reverse_qwen3": ("reverse", QWEN3, {"length": 128}),
    "reverse_mistral": ("reverse", MISTRAL, {"length": 128}),
    # ZeRO-3 over 4 ranks (sp 4): every rank draws only its shards, and the checkpoints are
    # streamed part by part (a bucket of 16 KiB: the embedding in 16 parts); transformers loads
    # them as any other.
    "forward_zero3": ("forward", dict(GQA, tie_embeddings=False),
                      {"length": 128, "sp": 4, "zero": 3}),
    # ZeRO-3 over 2 ranks loading transformers' save_pretrained: each rank reads only its shards'
    # bytes (tied embeddings, q/k/v biases).
    "reverse_zero3": ("reverse", QWEN2, {"sp": 2, "zero": 3}),
}

MICRO_BATCH = 2
STEPS = 2


FAILURES = []  # comparisons that failed; the case goes on to print the others, then fails


ARCHITECTURES = {family: classes[1].__name__ for family, classes in FAMILIES.items()}


def family_of(model_keys):
    return model_keys.get("family", "llama")


def write_case_config(path, work, model, length, sp, tokens, eval_tokens, zero_stage=0):
    sections = {
        "model": model,
        "mesh": {"sp": sp, "dp": 1},
        "sequence": {"length": length, "micro_batch": MICRO_BATCH, "grad_accum": 1},
        "data": {"source": "tokens:" + tokens, "token_dtype": "uint16"},
        "optim": optim_section(),
        "train": {"steps": STEPS, "seed": 0, "device": "cpu"},
        "checkpoint": {"dir": os.path.join(work, "ckpt"), "every": 1, "save_initial": True},
        "output": {"dir": os.path.join(work, "out")},
    }
    if zero_stage:
        sections["zero"] = {"stage": zero_stage, "bucket_mb": 1.0 / 64}
    if eval_tokens:
        sections["eval"] = {"source": "tokens:" + eval_tokens, "every": 0, "steps": 1}
    return write_run_config(path, sections, "tests/clients/hf_roundtrip.py")


def hf_loss(model, input_ids):
    """transformers' own causal-LM loss: labels=input_ids, shifted inside, mean over the batch."""
    with torch.no_grad():
        return model(input_ids=input_ids, labels=input_ids).loss.item()


def compare(what, ours, theirs, rtol):
    return hf_common.compare(FAILURES, what, ours, theirs, rtol)


def check_config(ckpt, model_keys, sliding_window=None):
    """transformers' reading of the checkpoint's config.json has the family and shapes we trained
    (for the reverse direction: those transformers wrote, as ulysses-train read them), and the
    sliding window (None: none; ulysses-train keeps one no shorter than the sequence)."""
    cfg = transformers.AutoConfig.from_pretrained(ckpt)
    name = os.path.join(os.path.basename(os.path.dirname(ckpt)), os.path.basename(ckpt))
    family = family_of(model_keys)
    expect = {"model_type": family,
              "architectures": [ARCHITECTURES[family]],  # the class from_pretrained makes
              "hidden_size": model_keys["hidden_size"],
              "num_hidden_layers": model_keys["num_layers"],
              "num_attention_heads": model_keys["num_heads"],
              "num_key_value_heads": model_keys["num_kv_heads"],
              "head_dim": model_keys["head_dim"],
              "intermediate_size": model_keys["intermediate_size"],
              "vocab_size": model_keys["vocab_size"],
              "tie_word_embeddings": model_keys["tie_embeddings"]}
    got = {key: getattr(cfg, key, None) for key in expect}
    # Qwen2's config has no head_dim: its attention takes hidden_size / num_attention_heads.
    got["head_dim"] = got["head_dim"] or cfg.hidden_size // cfg.num_attention_heads
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
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
    if family != "llama":
        got["sliding_window"] = getattr(cfg, "sliding_window", None)
        expect["sliding_window"] = sliding_window
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
    family = family_of(model_keys)
    g = MICRO_BATCH  # dp 1: G = dp * micro_batch * grad_accum
    tokens = os.path.join(work, "train.u16")
    eval_tokens = os.path.join(work, "eval.u16")
    write_tokens(tokens, (STEPS * g + 1) * length, vocab, seed=11)
    write_tokens(eval_tokens, (g + 1) * length, vocab, seed=12)
    config_path = os.path.join(work, "run.yaml")
    log(write_case_config(config_path, work, model_keys, length, sp, tokens, eval_tokens,
                          opts.get("zero", 0)))
    run_trainer(args.bin, config_path, sp, work)
    steps, evals = read_metrics(os.path.join(work, "out"))
    if sorted(steps) != list(range(1, STEPS + 1)):
        raise Mismatch(f"metrics.jsonl has steps {sorted(steps)}, expected 1..{STEPS}")

    ckpt = os.path.join(work, "ckpt")
    check_config(os.path.join(ckpt, "initial"), model_keys)
    for step, weights in [(1, "initial"), (2, "step-1")]:
        model = load_hf_model(os.path.join(ckpt, weights), expect_family=family)
        batch = read_samples(tokens, length, (step - 1) * g, g)
        compare(f"step {step} loss (HF loads {weights}/, samples [{(step - 1) * g}, {step * g}))",
                steps[step]["loss"], hf_loss(model, batch), LOSS_RTOL)
    if not evals:
        raise Mismatch("metrics.jsonl has no eval record")
    model = load_hf_model(os.path.join(ckpt, f"step-{STEPS}"), expect_family=family)
    compare(f"eval loss after step {STEPS} (HF loads step-{STEPS}/, eval samples [0, {g}))",
            evals[-1]["loss"], hf_loss(model, read_samples(eval_tokens, length, 0, g)), LOSS_RTOL)


def reverse_case(args, work, model_keys, opts):
    length, sp = opts.get("length", 64), opts.get("sp", 1)
    family = family_of(model_keys)
    g = MICRO_BATCH
    tokens = os.path.join(work, "train.u16")
    write_tokens(tokens, (STEPS * g + 1) * length, model_keys["vocab_size"], seed=21)

    # The Llama cases keep transformers' init (norms 1); the other families move norms and biases
    # off it, so that a dropped q_norm or bias shows in the step-1 loss.
    model = make_hf_model(model_keys, seed=1234, perturb_seed=None if family == "llama" else 5)
    hf_dir = os.path.join(work, "hf-init")
    model.save_pretrained(hf_dir, safe_serialization=True)
    log("transformers wrote " + hf_dir + ": " + ", ".join(sorted(os.listdir(hf_dir))))
    with open(os.path.join(hf_dir, "config.json")) as f:
        log(f.read())

    config_path = os.path.join(work, "run.yaml")
    log(write_case_config(config_path, work, {"load": hf_dir}, length, sp, tokens, None,
                          opts.get("zero", 0)))
    run_trainer(args.bin, config_path, sp, work)
    steps, _ = read_metrics(os.path.join(work, "out"))

    # transformers' own step: loss, gradients, clip_grad_norm_, torch.optim.AdamW.
    model.train()  # no dropout in these models (attention_dropout 0); train() only for autograd
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
    # ulysses-train's checkpoint of the loaded model says what it trained: the family and shapes
    # and RoPE transformers wrote.
    # (MistralConfig's default window of 4096 tokens, longer than the sequence, is kept.)
    check_config(os.path.join(work, "ckpt", "initial"), model_keys,
                 getattr(model.config, "sliding_window", None))
    # And transformers reads back what ulysses-train wrote from the loaded model.
    compare("step 1 loss, HF reloading ulysses-train's initial/ checkpoint",
            steps[1]["loss"],
            hf_loss(load_hf_model(os.path.join(work, "ckpt", "initial"), expect_family=family),
                    read_samples(tokens, length, 0, g)), LOSS_RTOL)


def main():
    args = hf_common.parse_case_args(__doc__, CASES)

    def body(work):
        direction, model_keys, opts = CASES[args.case]
        case = forward_case if direction == "forward" else reverse_case
        case(args, work, model_keys, opts)
    return hf_common.run_cases(args, "hf_roundtrip", body, FAILURES)

if __name__ == "__main__":
    sys.exit(main())
