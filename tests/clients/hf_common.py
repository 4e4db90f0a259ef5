"""Helpers shared by the transformers client tests (hf_roundtrip.py, families_test.py,
rope_scaling_test.py, checkpoint_files_test.py).

The decoder families ulysses-train implements, as transformers' own config and model classes; the
run-config model keys mapped to a transformers config; a flat uint16 token file and its samples;
run configs; starting ulysses-train (one process, or `ulysses-tune launch` for several ranks) and
reading its metrics.jsonl.

Data semantics: sample i of a flat file is tokens [i*L, (i+1)*L); labels are the
next token within the sample, the last position ignored; a step's loss is the mean cross-entropy
over every valid label of the global batch, which is what transformers computes with
labels=input_ids.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np
import torch
import torch.nn.functional as F
import transformers


# The optimizer both sides run: ulysses-train's run config (optim_section) and, on the transformers
# side, torch.optim.AdamW over every parameter as one group (weight decay on biases and norms too)
# with clip_grad_norm_. Betas and eps are ulysses-train's defaults, written out anyway.
LR = 1.0e-2
BETAS = (0.9, 0.95)
EPS = 1.0e-8
WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0


def optim_section(lr=LR, eps=EPS, weight_decay=WEIGHT_DECAY, grad_clip=GRAD_CLIP):
    """The run config's `optim:` for that optimizer (constant rate, no warm-up)."""
    return {"lr": lr, "betas": list(BETAS), "eps": eps, "weight_decay": weight_decay,
            "grad_clip": grad_clip, "warmup_steps": 0, "schedule": "constant"}


class Mismatch(Exception):
    pass


def log(msg):
    print(msg, flush=True)


# model.family -> (transformers config class, transformers model class)
FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
}


def hf_config(model_keys, **extra):
    """transformers' config of the family model_keys["family"] (default llama) with the shapes of
    the run config's `model:` keys; `extra` goes to the config class as it is
    (sliding_window=...)."""
    family = model_keys.get("family", "llama")
    config_class = FAMILIES[family][0]
    rope = {"rope_type": "default", "rope_theta": model_keys["rope_theta"]}
    if model_keys.get("rope_scaling_type"):
        rope = {"rope_type": model_keys["rope_scaling_type"],
                "rope_theta": model_keys["rope_theta"],
                "factor": model_keys["rope_scaling_factor"],
                "low_freq_factor": model_keys["rope_low_freq_factor"],
                "high_freq_factor": model_keys["rope_high_freq_factor"],
                "original_max_position_embeddings": model_keys["rope_original_max_position"]}
    kwargs = dict(hidden_size=model_keys["hidden_size"],
                  num_hidden_layers=model_keys["num_layers"],
                  num_attention_heads=model_keys["num_heads"],
                  num_key_value_heads=model_keys["num_kv_heads"],
                  intermediate_size=model_keys["intermediate_size"],
                  vocab_size=model_keys["vocab_size"],
                  rms_norm_eps=model_keys["rms_norm_eps"],
                  tie_word_embeddings=model_keys["tie_embeddings"],
                  rope_parameters=rope,
                  initializer_range=model_keys["init_std"],
                  max_position_embeddings=4096)
    # Qwen2's attention takes hd = h / hq (its config has no head_dim); the others read head_dim.
    if family != "qwen2":
        kwargs["head_dim"] = model_keys["head_dim"]
    elif model_keys["head_dim"] * model_keys["num_heads"] != model_keys["hidden_size"]:
        raise ValueError("qwen2: head_dim must be hidden_size / num_heads")
    kwargs.update(extra)
    return config_class(**kwargs)


def move_off_init(model, seed):
    """Moves what transformers initializes to constants away from them, with seeded noise: every
    norm weight (input/post-attention norms, the final norm, Qwen3's q_norm/k_norm; init 1) to
    uniform [0.5, 1.5) and every bias (Qwen2's q/k/v; init 0) to normal(0, 0.2). A parameter that
    a reader drops, swaps or misnames then changes the loss. Returns the names moved."""
    generator = torch.Generator().manual_seed(seed)
    moved = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * 0.2)
            elif "norm" in name:
                p.copy_(torch.rand(p.shape, generator=generator, dtype=torch.float64) + 0.5)
            else:
                continue
            moved.append(name)
    return moved


def make_hf_model(model_keys, seed, perturb_seed=None, **extra):
    """A random fp32 model of transformers' own class for model_keys' family, seeded; with
    perturb_seed its norms and biases are moved off their init (move_off_init)."""
    torch.manual_seed(seed)
    model = FAMILIES[model_keys.get("family", "llama")][1](hf_config(model_keys, **extra))
    model = model.to(torch.float32)
    if perturb_seed is not None:
        move_off_init(model, perturb_seed)
    return model


def load_hf_model(model_dir, expect_family=None, dtype=torch.float32):
    """transformers' AutoModelForCausalLM.from_pretrained(model_dir): the class config.json names,
    eager attention; raises Mismatch when it is not expect_family's class or when transformers
    reports a missing, unexpected or mismatched tensor (it would initialize a missing one itself,
    and a loss comparison might not notice a bias of zeros)."""
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=dtype, attn_implementation="eager", output_loading_info=True)
    problems = {k: v for k, v in info.items() if v and k != "error_msgs"}
    if info.get("error_msgs"):
        problems["error_msgs"] = info["error_msgs"]
    if problems:
        raise Mismatch(f"{model_dir}: transformers' from_pretrained reports {problems}")
    if expect_family is not None and type(model) is not FAMILIES[expect_family][1]:
        raise Mismatch(f"{model_dir}: transformers loads it as {type(model).__name__}, expected "
                       f"{FAMILIES[expect_family][1].__name__}")
    model.eval()
    return model


def causal_lm_loss(logits, input_ids):
    """Mean cross-entropy of the next token within each sample, over the batch, in logits' dtype
    (transformers' own loss casts logits to fp32 first, which would make an fp64 reference fp32)."""
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), input_ids[:, 1:].reshape(-1))


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


def write_run_config(path, sections, origin):
    """A run config of flow-style sections {section: {key: value}}, in the order given."""
    text = f"# written by {origin}\n" + "".join(yaml_section(k, v) for k, v in sections.items())
    with open(path, "w") as f:
        f.write(text)
    return text


def trainer_command(bindir, config_path, nproc):
    """ulysses-train for one rank, `ulysses-tune launch --nproc N` for several."""
    bindir = os.path.abspath(bindir)  # the ranks run in their work directory
    if nproc == 1:
        cmd = [os.path.join(bindir, "ulysses-train"), "--config", config_path]
    else:
        cmd = [os.path.join(bindir, "ulysses-tune"), "launch", config_path, "--nproc", str(nproc)]
    if not os.access(cmd[0], os.X_OK):
        raise Mismatch(f"{cmd[0]}: not found or not executable (build it first)")
    return cmd


def run_trainer(bindir, config_path, nproc, work, check=True, quiet=False):
    """Runs ulysses-train's ranks in `work`; returns the CompletedProcess. check: a non-zero exit
    is a Mismatch (with the output's tail printed)."""
    cmd = trainer_command(bindir, config_path, nproc)
    log("$ " + " ".join(cmd))
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    if not quiet or proc.returncode != 0:
        sys.stdout.write(proc.stdout[-4000:])
    if check and proc.returncode != 0:
        sys.stdout.write(proc.stderr[-4000:])
        raise Mismatch(f"{cmd[0]} exited with status {proc.returncode}")
    return proc


def read_metrics(out_dir):
    """metrics.jsonl of a run: ({step: record}, [eval records])."""
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


def parse_case_args(doc, cases):
    """The command line every client test takes (--bin DIR --case NAME[,NAME...] [--keep]), with
    torch's threads set from OMP_NUM_THREADS and transformers' progress bars and info logging off;
    logs the versions and the cases. Several cases share one process (and one import of
    transformers, several seconds); run_cases runs each in its own work directory."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--bin", required=True, help="directory holding ulysses-train")
    parser.add_argument("--case", required=True,
                        help="case or comma-separated cases, of: " + ", ".join(sorted(cases)))
    parser.add_argument("--keep", action="store_true", help="keep the work directories")
    args = parser.parse_args()
    args.cases = args.case.split(",")
    unknown = [c for c in args.cases if c not in cases]
    if unknown:
        parser.error(f"--case: unknown case {unknown[0]!r} (one of {', '.join(sorted(cases))})")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    transformers.logging.disable_progress_bar()
    transformers.logging.set_verbosity_error()
    log(f"transformers {transformers.__version__}, torch {torch.__version__}, "
        f"cases {', '.join(args.cases)}")
    return args


def run_cases(args, prefix, body, failures):
    """run_case for each of args.cases in turn (args.case set to it), each judged on its own
    comparisons; every case runs whatever an earlier one did. Returns 0 when all passed, else 1,
    after a line naming the cases that failed."""
    failed = []
    for case in args.cases:
        args.case = case
        failures.clear()
        try:
            status = run_case(f"{prefix}_{case}", body, failures, keep=args.keep)
        except Exception:  # an error, not a mismatch: the case fails, the next one runs
            log(f"FAILED {prefix}_{case} with an error:\n{traceback.format_exc()}")
            status = 1
        if status:
            failed.append(case)
    failures.clear()
    if failed:
        log(f"FAILED cases: {', '.join(failed)} (of {len(args.cases)})")
    return 1 if failed else 0


def refused_run_problems(bindir, config_path, sections, nproc, run_dir, key):
    """Runs ulysses-train on a run config it must refuse: the problems found (exit status not 2,
    output not one line naming `key`, metrics.jsonl written), [] when it was refused as it
    should be."""
    proc = run_trainer(bindir, config_path, nproc, run_dir, check=False)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    log(f"exit status {proc.returncode}, stdout {proc.stdout!r}, stderr {proc.stderr!r}")
    problems = []
    if proc.returncode != 2:
        problems.append(f"exit status {proc.returncode}, expected 2")
    if len(lines) != 1 or key not in lines[0]:
        problems.append(f"the output is not one line naming {key}: {lines!r}")
    if os.path.exists(os.path.join(sections["output"]["dir"], "metrics.jsonl")):
        problems.append("a refused run left metrics.jsonl")
    return problems


def run_case(name, body, failures, keep=False):
    """Runs body(work) in a fresh work directory: the case passes when body raises no Mismatch and
    leaves `failures` (the comparisons that failed, each kept so that all are printed) empty. The
    directory is removed after a pass unless `keep`. Returns the exit status (0 pass, 1 fail)."""
    start = time.monotonic()
    work = tempfile.mkdtemp(prefix=f"{name}_")
    ok = False
    try:
        body(work)
        if failures:
            raise Mismatch(f"{len(failures)} comparison(s) failed:\n  " + "\n  ".join(failures))
        ok = True
    except Mismatch as e:
        log(f"FAILED {name}: {e}")
    finally:
        if ok and not keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"work directory kept: {work}")
    log(f"{'PASSED' if ok else 'FAILED'} {name} in {time.monotonic() - start:.1f}s")
    return 0 if ok else 1


def compare(failures, what, ours, theirs, rtol):
    """Logs ours against transformers' value with their relative difference; a difference above
    rtol (or a non-finite value) is appended to `failures`. Returns the relative difference."""
    rel = abs(ours - theirs) / max(abs(theirs), 1e-30)
    ok = math.isfinite(ours) and math.isfinite(theirs) and rel <= rtol
    log(f"{'ok  ' if ok else 'FAIL'} {what}: ulysses-train {ours:.9g}  transformers {theirs:.9g}  "
        f"rel diff {rel:.2e} (tolerance {rtol:.0e})")
    if not ok:
        failures.append(f"{what}: ulysses-train {ours!r} != transformers {theirs!r} "
                        f"(rel {rel:.3e} > {rtol:.0e})")
    return rel

