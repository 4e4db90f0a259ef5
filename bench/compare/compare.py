#!/usr/bin/env python3
"""ulysses-train against Hugging Face transformers (and DeepSpeed where it is installed), on the
same model, weights and tokens, on CPU or GPU: tokens/s and MFU at given lengths (repeats
interleaved: ours, theirs, ours, theirs, ...) and the longest length each trains (doubling, then
bisection, on out-of-memory: on GPU the device's own limit, on CPU a memory cap). Every run is one
process and one JSON line in OUT/results.jsonl; OUT/summary.md holds the tables.
Method, configurations, fields and the FLOP formula: bench/compare/README.md.

  compare.py run --out DIR [--device cuda] [--model llama-3.2-1b] [--lengths 8192,32768] ...
  compare.py run --out DIR --dry-run          # the same on CPU with a tiny model, in a minute
  compare.py table DIR/results.jsonl          # the markdown tables again
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MARKER = ".ulysses-bench"  # marks an output directory this harness created

# Ours: ulysses-train with these run-config overrides.
OURS = {
    "ours-alst": ["memory.tiled_mlp=auto", "memory.tiled_loss=auto", "memory.checkpointing=true",
                  "memory.offload_activations=true", "memory.offload_optimizer=true"],
    "ours-alst-devgrads": ["memory.tiled_mlp=auto", "memory.tiled_loss=auto",
                           "memory.checkpointing=true", "memory.offload_activations=true",
                           "memory.offload_optimizer=true", "memory.offload_gradients=false"],
    "ours-tiled": ["memory.tiled_mlp=auto", "memory.tiled_loss=auto",
                   "memory.checkpointing=true"],
    "ours-plain": [],
}
# Theirs: train_hf.py with these flags.
THEIRS = {
    "hf": ["--checkpointing", "on"],
    "hf-nockpt": ["--checkpointing", "off"],
    "ds-zero3": ["--checkpointing", "on", "--deepspeed"],
}
TINY_SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
              "vocab_size": 4096, "tie_word_embeddings": False, "rms_norm_eps": 1e-5,
              "max_position_embeddings": 65536}


def gib(b):
    return b / 2 ** 30


# ---------------------------------------------------------------------------------------------
# The model: a profile (profiles/models/NAME.yaml) as LlamaConfig fields, and its FLOPs.

def load_yaml(path):
    try:
        import yaml
    except ImportError:
        sys.exit(f"error: {path}: reading a profile needs PyYAML, which {sys.executable} lacks "
                 f"(run this script with the project's .venv/bin/python)")
    with open(path) as f:
        return yaml.safe_load(f)


def model_shape(spec, max_length):
    """LlamaConfig fields from a preset name, a profile path or a JSON object. RoPE scaling is
    left out: it changes values, not cost, and both sides read the same config.json."""
    if spec.lstrip().startswith("{"):
        shape = json.loads(spec)
    else:
        path = spec if os.path.exists(spec) else os.path.join(ROOT, "profiles", "models",
                                                              spec + ".yaml")
        m = load_yaml(path)["model"]
        shape = {"hidden_size": m["hidden_size"], "num_hidden_layers": m["num_layers"],
                 "num_attention_heads": m["num_heads"],
                 "num_key_value_heads": m.get("num_kv_heads", m["num_heads"]),
                 "head_dim": m.get("head_dim", m["hidden_size"] // m["num_heads"]),
                 "intermediate_size": m["intermediate_size"], "vocab_size": m["vocab_size"],
                 "rope_theta": m.get("rope_theta", 10000.0),
                 "rms_norm_eps": m.get("rms_norm_eps", 1e-5),
                 "tie_word_embeddings": bool(m.get("tie_embeddings", False))}
    # A fixed ceiling (1M tokens unless longer is asked for), so that every part of a comparison
    # shares one model directory.
    shape["max_position_embeddings"] = max(shape.get("max_position_embeddings", 0), 1 << 20,
                                           max_length)
    return shape


def model_shape_of_dir(model_dir):
    """The LlamaConfig fields the FLOP count needs, from an HF model directory's config.json."""
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "intermediate_size", "vocab_size", "tie_word_embeddings")
    return {k: c[k] for k in keys if k in c}


def flops_per_token(shape, length):
    """Training model FLOPs per token at sequence length `length` (src/profile/flops.h):
    6 * N_matmul + 6 * L * sl * hq * hd, N_matmul = L * (h*hq*hd + 2*h*hkv*hd + hq*hd*h + 3*h*ffn)
    + V*h."""
    h, layers = shape["hidden_size"], shape["num_hidden_layers"]
    hq, hkv = shape["num_attention_heads"], shape["num_key_value_heads"]
    hd = shape.get("head_dim") or h // hq
    ffn, vocab = shape["intermediate_size"], shape["vocab_size"]
    n_matmul = layers * (h * hq * hd + 2 * h * hkv * hd + hq * hd * h + 3 * h * ffn) + vocab * h
    return 6.0 * n_matmul + 6.0 * layers * length * hq * hd


def peak_tflops(args):
    if args.peak_tflops:
        return args.peak_tflops
    if args.hardware:
        path = args.hardware if os.path.exists(args.hardware) else os.path.join(
            ROOT, "profiles", "hardware", args.hardware + ".yaml")
        return float(load_yaml(path)["peak_tflops"][args.dtype])
    return 0.0


# ---------------------------------------------------------------------------------------------
# One run = one process.

def run_child(cmd, env, log_path, timeout):
    """Runs cmd; returns (exit status or None on timeout, peak RSS bytes, wall seconds)."""
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                return proc.returncode, usage.ru_maxrss * 1024, time.perf_counter() - t0
            if time.perf_counter() - t0 > timeout:
                proc.kill()
                _, _, usage = os.wait4(proc.pid, 0)
                return None, usage.ru_maxrss * 1024, time.perf_counter() - t0
            time.sleep(0.05)


def ours_config(args, length, steps, run_dir, limit_gib):
    memory = [f"precision: {args.ours_precision}"]
    if limit_gib:
        memory.append(f"limit_gib: {limit_gib}")
    profile = [f"warmup_steps: {min(args.warmup, steps - 1)}"]
    if args.peak:
        profile.append(f"peak_tflops: {args.peak}")
    text = (f"# written by bench/compare/compare.py\n"
            f"model: {{load: {json.dumps(args.model_dir)}"
            f"{', fused_kernels: true' if args.ours_fused else ''}}}\n"
            f"mesh: {{sp: 1, dp: 1}}\n"
            f"sequence: {{length: {length}, micro_batch: 1, grad_accum: 1}}\n"
            f"data: {{source: {json.dumps('tokens:' + args.tokens)}, "
            f"token_dtype: {args.token_dtype}}}\n"
            f"memory: {{{', '.join(memory)}}}\n"
            f"optim: {{lr: 1.0e-3, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: 0.0, "
            f"grad_clip: 1.0}}\n"
            f"train: {{steps: {steps}, seed: 0, device: {args.device}}}\n"
            f"profile: {{{', '.join(profile)}}}\n"
            f"output: {{dir: {json.dumps(run_dir)}}}\n")
    path = run_dir + ".yaml"
    with open(path, "w") as f:
        f.write(text)
    return path


def read_ours(run_dir, rec):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        steps = [json.loads(x) for x in f if x.strip()]
    steps = [s for s in steps if "step" in s and "loss" in s]
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    rec["step_ms_all"] = [s["step_ms"] for s in steps]
    rec["loss"] = [s["loss"] for s in steps]
    for key in ("max_rank_peak_allocated_bytes", "max_rank_peak_reserved_bytes",
                "max_rank_outside_allocator_bytes", "peak_host_bytes", "model_flops_per_step",
                "mfu", "attention_kernels", "offload_ms_median"):
        if key in summary:
            rec["ours_" + key] = summary[key]
    # Where the optimizer's time goes (its parts, median ms) and the host pass's threads.
    phases = summary.get("phases_ms_median", {})
    rec["ours_optimizer_parts_ms"] = {k: v for k, v in phases.items() if k.startswith("optimizer")}
    rec["ours_optimizer_host_threads"] = summary.get("memory", {}).get("optimizer_host_threads", 0)
    rec["peak_allocated_bytes"] = summary.get("max_rank_peak_allocated_bytes")
    rec["peak_reserved_bytes"] = summary.get("max_rank_peak_reserved_bytes")
    rec["outside_allocator_bytes"] = summary.get("max_rank_outside_allocator_bytes")


def optimizer_table(runs):
    """Lines of the offloaded optimizer's parts per (length, configuration), median ms over the
    runs that finished; none when no run offloaded its optimizer."""
    parts = ("optimizer", "optimizer_norm", "optimizer_download", "optimizer_host_update",
             "optimizer_upload")
    rows = {}
    for r in runs:
        got = r.get("ours_optimizer_parts_ms") or {}
        if r["status"] == "ok" and "optimizer_host_update" in got:
            rows.setdefault((r["length"], r["config"]), []).append(r)
    if not rows:
        return []
    lines = ["Offloaded optimizer, median ms per step (host threads; the parts of `optimizer`):", "",
             "| length | configuration | host threads | " + " | ".join(parts) + " |",
             "|---:|---|---:|" + "---:|" * len(parts)]
    for (length, config), group in sorted(rows.items()):
        cells = []
        for p in parts:
            values = [r["ours_optimizer_parts_ms"][p] for r in group
                      if p in r["ours_optimizer_parts_ms"]]
            cells.append(f"{statistics.median(values):.1f}" if values else "")
        lines.append(f"| {length} | {config} | {group[0]['ours_optimizer_host_threads']} | "
                     + " | ".join(cells) + " |")
    return lines + [""]


def read_theirs(out_json, rec):
    with open(out_json) as f:
        out = json.load(f)
    rec["step_ms_all"] = out["step_ms"]
    rec["loss"] = out["loss"]
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "outside_allocator_bytes",
                "attn_implementation", "optimizer", "transformers", "deepspeed_version"):
        if key in out:
            rec[key] = out[key]


def run_case(args, config, length, steps, tag, timeout, limit_gib=0.0):
    """One process of `config` at `length` under `limit_gib` (0 = no cap); returns its record
    (README.md, "Output")."""
    run_dir = os.path.join(args.out, "runs", tag)
    os.makedirs(os.path.dirname(run_dir), exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    if args.device == "cuda":
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    elif limit_gib:
        # The CPU cap is on address space: keep glibc from reserving 64 MiB for another arena,
        # which it does when a thread finds the arena busy, so by chance of scheduling (with 2
        # allowed, a 0.1 GiB cap failed at the first length on a loaded machine); on both sides.
        env.setdefault("MALLOC_ARENA_MAX", "1")
    rec = {"kind": "run", "config": config, "side": "ours" if config in OURS else "theirs",
           "device": args.device, "dtype": args.dtype, "length": length, "steps": steps,
           "warmup_steps": min(args.warmup, steps - 1), "limit_gib": limit_gib, "tag": tag}
    if config in OURS:
        rec["precision"] = args.ours_precision
        rec["fused_kernels"] = args.ours_fused
    if config in OURS:
        cmd = [os.path.join(args.bin, "ulysses-train"), "--config",
               ours_config(args, length, steps, run_dir, limit_gib)]
        for s in OURS[config]:
            cmd += ["--set", s]
    else:
        cmd = [args.python, os.path.join(HERE, "train_hf.py"), "--model-dir", args.model_dir,
               "--tokens", args.tokens, "--token-dtype", args.token_dtype, "--length",
               str(length), "--steps", str(steps), "--device", args.device, "--dtype",
               args.dtype, "--threads", str(args.threads), "--limit-gib", str(limit_gib),
               "--out", run_dir + ".json"] + THEIRS[config]
    rec["command"] = " ".join(cmd)
    rc, rss, wall = run_child(cmd, env, run_dir + ".log", timeout)
    rec.update(exit=rc, wall_s=round(wall, 2), peak_rss_bytes=rss)
    rec["status"] = ("timeout" if rc is None else "ok" if rc == 0 else "oom" if rc == 12
                     else "error")
    if rec["status"] == "ok":
        try:
            (read_ours if config in OURS else read_theirs)(
                run_dir if config in OURS else run_dir + ".json", rec)
        except (OSError, ValueError, KeyError) as e:
            rec["status"], rec["error"] = "error", f"unreadable output: {e}"
    if rec["status"] == "ok":
        measured = rec["step_ms_all"][rec["warmup_steps"]:] or rec["step_ms_all"]
        rec["step_ms"] = statistics.median(measured)
        rec["tokens_per_s"] = length / (rec["step_ms"] / 1e3)
        rec["model_flops_per_token"] = flops_per_token(args.shape, length)
        rec["tflops"] = rec["model_flops_per_token"] * rec["tokens_per_s"] / 1e12
        if args.peak:
            rec["mfu"] = rec["tflops"] / args.peak
        # The peak that decides what fits: the allocator's reserved peak on CUDA, RSS on CPU.
        rec["peak_bytes"] = (rec.get("peak_reserved_bytes") if args.device == "cuda"
                             else rec["peak_rss_bytes"])
    else:
        with open(run_dir + ".log", errors="replace") as f:
            rec["log_tail"] = f.read()[-800:]
    return rec


# ---------------------------------------------------------------------------------------------
# The two parts.

class Results:
    """OUT/results.jsonl, appended one record at a time (flushed: a killed run keeps its lines)."""

    def __init__(self, path):
        self.path = path
        self.records = []

    def add(self, rec):
        rec["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.records.append(rec)
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")


def part_throughput(args, results):
    """Interleaved: for each repeat, for each length, every configuration once, in order."""
    failed = set()  # (config, length) that did not fit: not repeated
    for rep in range(args.reps):
        for length in args.lengths:
            for config in args.configs:
                if (config, length) in failed:
                    continue
                tag = f"throughput/{config}-{length}-r{rep}"
                rec = run_case(args, config, length, args.warmup + args.steps, tag, args.timeout)
                rec["part"], rec["rep"] = "throughput", rep
                results.add(rec)
                if rec["status"] != "ok":
                    failed.add((config, length))
                say(f"{config:10s} L={length:8d} rep {rep}: {rec['status']:7s}"
                    + (f" {rec['tokens_per_s']:10.0f} tokens/s  peak {gib(rec['peak_bytes'] or 0):.2f}"
                       f" GiB" if rec["status"] == "ok" else ""))


def part_maxlen(args, results):
    """Per configuration: double from --start until a run fails (or --max-length), then bisect
    until the bracket is within max(--resolution x longest, --granule); 2 steps per probe (the
    optimizer states exist from the first update on)."""
    for config in args.maxlen_configs:
        t0 = time.perf_counter()
        tried = {}

        def fits(length):
            rec = run_case(args, config, length, 2, f"maxlen/{config}-{length}",
                           args.probe_timeout, args.limit_gib)
            rec["part"] = "maxlen"
            rec["kind"] = "probe"
            results.add(rec)
            tried[length] = rec
            say(f"{config:10s} maxlen L={length:8d}: {rec['status']} ({rec['wall_s']:.0f} s)")
            return {"ok": True, "oom": False}.get(rec["status"])

        def over_budget():
            return args.budget_s and time.perf_counter() - t0 > args.budget_s

        lo, hi, note = 0, None, ""
        length = args.start
        while True:  # doubling (halving first when even --start does not fit)
            ok = fits(length)
            if ok is None:
                note = f"probe at {length} ended {tried[length]['status']}"
                break
            if ok:
                lo = length
                if hi is not None:  # found by halving below a failure: bisect between them
                    break
                if length >= args.max_length:
                    note = f"fits at --max-length {args.max_length}"
                    break
                length = min(length * 2, args.max_length)
            else:
                hi = length
                if lo or length <= args.granule:
                    break
                length = max(args.granule, length // 2 // args.granule * args.granule)
            if over_budget():
                note = f"time budget {args.budget_s} s spent"
                break
        while (not note and hi is not None and lo and
               hi - lo > max(lo * args.resolution, args.granule)):
            if over_budget():
                note = f"time budget {args.budget_s} s spent"
                break
            mid = (lo + hi) // 2 // args.granule * args.granule
            ok = fits(mid)
            if ok is None:
                note = f"probe at {mid} ended {tried[mid]['status']}"
                break
            lo, hi = (mid, hi) if ok else (lo, mid)
        best = tried.get(lo, {})
        results.add({"kind": "maxlen", "part": "maxlen", "config": config, "device": args.device,
                     "dtype": args.dtype, "limit_gib": args.limit_gib, "longest_ok": lo,
                     "shortest_failed": hi, "note": note, "probes": len(tried),
                     "seconds": round(time.perf_counter() - t0, 1),
                     "peak_bytes_at_longest": best.get("peak_bytes"),
                     "tokens_per_s_at_longest": best.get("tokens_per_s")})
        say(f"{config:10s} longest that trains: {lo} (shortest that failed: {hi}) {note}")


# ---------------------------------------------------------------------------------------------
# Tables.

def table(records):
    """The markdown of OUT/summary.md from the records."""
    lines = []
    env = [r for r in records if r.get("kind") == "env"]
    if env:
        e = env[-1]
        ours_precision = e.get("ours_precision", e["dtype"])
        fused = ", model.fused_kernels true" if e.get("ours_fused_kernels") else ""
        lines += [f"Device {e['device']} ({e.get('device_name', '')}), {e['dtype']} "
                  f"(ours: memory.precision {ours_precision}{fused}), model "
                  f"{e['model']} ({e['parameters'] / 1e6:.1f} M parameters), peak "
                  f"{e['peak_tflops'] or 'unknown'} TFLOP/s per device; torch {e.get('torch')}, "
                  f"transformers {e.get('transformers')}, DeepSpeed "
                  f"{e.get('deepspeed') or 'not installed'}.", ""]
    runs = [r for r in records if r.get("kind") == "run"]
    if runs:
        lines += ["| length | configuration | runs ok | tokens/s (median) | step ms (median) | "
                  "TFLOP/s | MFU | peak GiB | loss step 1 |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        order = {c: i for i, c in enumerate(dict.fromkeys(r["config"] for r in runs))}
        for length, config in sorted({(r["length"], r["config"]) for r in runs},
                                     key=lambda k: (k[0], order[k[1]])):
            group = [r for r in runs if r["length"] == length and r["config"] == config]
            ok = [r for r in group if r["status"] == "ok"]
            if not ok:
                lines.append(f"| {length} | {config} | 0 of {len(group)} | "
                             f"{group[0]['status']} | | | | | |")
                continue
            med = lambda key: statistics.median(r[key] for r in ok)  # noqa: E731
            mfu = f"{med('mfu'):.3f}" if all("mfu" in r for r in ok) else ""
            peak = statistics.median(r["peak_bytes"] or 0 for r in ok)
            lines.append(f"| {length} | {config} | {len(ok)} of {len(group)} | "
                         f"{med('tokens_per_s'):.0f} | {med('step_ms'):.1f} | "
                         f"{med('tflops'):.3g} | {mfu} | {gib(peak):.2f} | {ok[0]['loss'][0]:.6f} |")
        lines.append("")
        lines += optimizer_table(runs)
    found = [r for r in records if r.get("kind") == "maxlen"]
    if found:
        lines += ["| configuration | longest that trains | shortest that failed | probes | "
                  "peak GiB at longest | note |", "|---|---:|---:|---:|---:|---|"]
        for r in found:
            peak = r.get("peak_bytes_at_longest")
            lines.append(f"| {r['config']} | {r['longest_ok']} | {r['shortest_failed'] or ''} | "
                         f"{r['probes']} | {gib(peak):.2f} | {r['note']} |" if peak else
                         f"| {r['config']} | {r['longest_ok']} | {r['shortest_failed'] or ''} | "
                         f"{r['probes']} | | {r['note']} |")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------

def say(text):
    print(text, flush=True)


def prepare_out(out):
    """OUT must be new, empty, or made by this harness (MARKER inside)."""
    if os.path.isdir(out) and os.listdir(out) and not os.path.exists(os.path.join(out, MARKER)):
        sys.exit(f"error: --out {out}: not empty and not made by bench/compare "
                 f"(no {MARKER} in it); choose a new directory")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, MARKER), "w") as f:
        f.write("bench/compare/compare.py output directory\n")


def python_has(python, modules):
    """Whether `python` has every module of the comma-separated list installed. It finds them
    without importing them (importing torch, transformers and DeepSpeed takes 5-15 s each time the
    harness starts); an installed module that fails to import fails the run that needs it, with
    its own error."""
    code = ("import importlib.util, sys\n"
            "sys.exit(0 if all(importlib.util.find_spec(m.strip()) for m in sys.argv[1].split(','))"
            " else 1)")
    return subprocess.run([python, "-c", code, modules], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def baseline_python(requested):
    """The Python that runs transformers' side: --python when given, else this interpreter when it
    imports torch and transformers, else the project's venv (.venv, what scripts/install-deps.sh
    makes). Exits with one line when none of them can."""
    if requested:
        if not python_has(requested, "torch,transformers"):
            sys.exit(f"error: --python: {requested} cannot import torch and transformers")
        return requested
    candidates = [sys.executable, os.path.join(ROOT, ".venv", "bin", "python")]
    for python in candidates:
        if os.path.exists(python) and python_has(python, "torch,transformers"):
            return python
    sys.exit(f"error: --python: {sys.executable} cannot import torch and transformers, and there "
             f"is no project venv with them ({candidates[1]}); run scripts/install-deps.sh or "
             f"pass --python PY")


def versions(python):
    code = ("import json, importlib.metadata as m\nv = {}\nfor p in ('torch', 'transformers', "
            "'deepspeed'):\n    try: v[p] = m.version(p)\n    except Exception: v[p] = None\n"
            "print(json.dumps(v))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def cmd_run(args):
    if args.dry_run:
        args.device, args.dtype = "cpu", "fp32"
        args.model = json.dumps(TINY_SHAPE)
        args.lengths = args.lengths or "256"
        args.reps, args.warmup, args.steps = 2, 1, 1
        args.start, args.max_length, args.granule = 512, 4096, 512
        args.limit_gib = args.limit_gib or 0.1
        args.hardware = args.hardware or "cpu-local"
        # No time budget: the search ends by its resolution, whatever the load of the machine.
        args.timeout, args.probe_timeout, args.budget_s = 300, 300, 0
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    if args.dtype == "bf16" and args.device != "cuda":
        sys.exit("error: --dtype bf16 needs --device cuda (ulysses-train runs bf16 only on CUDA)")
    # Ours under --dtype bf16: memory.precision bf16 (fp32 gradient sums, masters and moments) or
    # bf16-states (bf16 gradients and moments, no masters: transformers' numerics).
    args.ours_precision = args.ours_precision or args.dtype
    if args.ours_fused and args.device != "cuda":
        sys.exit("error: --ours-fused needs --device cuda (the fused kernels are CUDA kernels)")
    if args.dtype == "fp32" and args.ours_precision != "fp32":
        sys.exit(f"error: --ours-precision {args.ours_precision} needs --dtype bf16")
    if args.dtype == "bf16" and args.ours_precision == "fp32":
        sys.exit("error: --ours-precision fp32 with --dtype bf16: give bf16 or bf16-states")
    args.lengths = [int(x) for x in (args.lengths or "4096,16384").split(",")]
    args.max_length = args.max_length or max(args.lengths) * 16
    if args.device == "cpu" and "maxlen" in args.parts and not args.limit_gib:
        sys.exit("error: --limit-gib: the longest-length search on CPU needs a memory cap")
    args.python = baseline_python(args.python)
    has_ds = python_has(args.python, "deepspeed")
    if args.configs:
        args.configs = args.configs.split(",")
    else:
        args.configs = ["ours-alst", "hf"] + (["ds-zero3"] if has_ds else [])
    for c in args.configs:
        if c not in OURS and c not in THEIRS:
            sys.exit(f"error: --configs: unknown configuration '{c}' "
                     f"(one of {', '.join(list(OURS) + list(THEIRS))})")
        if (args.ours_precision == "bf16-states" and c in OURS
                and "memory.offload_optimizer=true" in OURS[c]):
            sys.exit(f"error: --ours-precision bf16-states: {c} offloads the optimizer, which keeps "
                     f"fp32 master weights; use ours-tiled or ours-plain")
        if c == "ds-zero3" and not has_ds:
            sys.exit(f"error: --configs: ds-zero3 needs DeepSpeed, which {args.python} lacks")
    args.maxlen_configs = (args.maxlen_configs.split(",") if args.maxlen_configs
                           else [c for c in args.configs if c != "ds-zero3"] if args.dry_run
                           else args.configs)
    args.peak = peak_tflops(args)
    args.shape = (model_shape_of_dir(args.model_dir) if args.model_dir
                  else model_shape(args.model, args.max_length))
    prepare_out(args.out)
    results = Results(os.path.join(args.out, "results.jsonl"))

    # The model and the tokens, made once per data directory (--data, default OUT) and reused
    # while the shape is the same and the tokens suffice.
    data = args.data or args.out
    if data != args.out:
        prepare_out(data)
    args.tokens = os.path.join(data, "tokens.bin")
    shape_file = os.path.join(data, "shape.json")
    need_tokens = max(args.max_length, max(args.lengths)) * (args.warmup + args.steps + 1)
    width = 2 if args.shape["vocab_size"] <= 65536 else 4
    make = []
    if args.model_dir is None:
        args.model_dir = os.path.join(data, "model")
        if not (os.path.exists(shape_file) and json.load(open(shape_file)) == args.shape and
                os.path.exists(os.path.join(args.model_dir, "config.json"))):
            shutil.rmtree(args.model_dir, ignore_errors=True)
            make.append("model")
    if not (os.path.exists(args.tokens + ".dtype") and
            os.path.getsize(args.tokens) >= need_tokens * width):
        make.append("tokens")
    if make:
        say(f"making the {' and '.join(make)} in {data}")
        out = subprocess.run([args.python, os.path.join(HERE, "make_model.py"), "--shape", "-",
                              "--out", args.model_dir, "--tokens", args.tokens, "--num-tokens",
                              str(need_tokens), "--device", args.device, "--make", ",".join(make)],
                             input=json.dumps(args.shape), capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"error: make_model.py failed:\n{out.stderr[-2000:]}")
        made_info = json.loads(out.stdout.strip().splitlines()[-1])
        if "tokens" in make:
            with open(args.tokens + ".dtype", "w") as f:
                f.write(made_info["token_dtype"] + "\n")
        if "model" in make:
            with open(shape_file, "w") as f:
                json.dump(args.shape, f, indent=1)
    args.token_dtype = open(args.tokens + ".dtype").read().strip()
    # Parameters: the matmul weights (LM head included), the embedding unless tied, the norms.
    h, v = args.shape["hidden_size"], args.shape["vocab_size"]
    tied = args.shape.get("tie_word_embeddings")
    parameters = int(flops_per_token(args.shape, 0) / 6 + (0 if tied else v * h) +
                     h * (2 * args.shape["num_hidden_layers"] + 1))
    env = {"kind": "env", "device": args.device, "dtype": args.dtype,
           "ours_precision": args.ours_precision, "ours_fused_kernels": args.ours_fused,
           "model": args.model if not args.model.lstrip().startswith("{") else "inline",
           "shape": args.shape, "parameters": parameters, "peak_tflops": args.peak,
           "configs": args.configs, "lengths": args.lengths, "reps": args.reps,
           "limit_gib": args.limit_gib, "threads": args.threads, "bin": args.bin,
           **versions(args.python)}
    if args.device == "cuda":
        q = subprocess.run([args.python, "-c", "import torch; print(torch.cuda.get_device_name())"],
                           capture_output=True, text=True)
        env["device_name"] = q.stdout.strip()
    results.add(env)
    if "throughput" in args.parts:
        part_throughput(args, results)
    if "maxlen" in args.parts:
        part_maxlen(args, results)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(table(results.records) + "\n")
    say("\n" + table(results.records))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the comparison")
    r.add_argument("--out", required=True, help="output directory (new, or made by this tool)")
    r.add_argument("--dry-run", action="store_true",
                   help="CPU, fp32, a tiny model and short lengths: checks the whole pipeline")
    r.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    r.add_argument("--dtype", choices=["fp32", "bf16"], help="default: bf16 on cuda, else fp32")
    r.add_argument("--ours-precision", choices=["fp32", "bf16", "bf16-states"],
                   help="ours' memory.precision (default: --dtype). With --dtype bf16: bf16 keeps "
                        "fp32 gradient sums, master weights and AdamW moments; bf16-states keeps "
                        "bf16 gradients and moments and no masters, as theirs does (peaks compare "
                        "one to one; not with ours-alst, whose offloaded optimizer keeps masters)")
    r.add_argument("--ours-fused", action="store_true",
                   help="ours with model.fused_kernels true (the fused RMSNorm and SwiGLU CUDA "
                        "kernels; needs --device cuda)")
    r.add_argument("--model", default="llama-3.2-1b",
                   help="profiles/models preset, a profile path, or a JSON object of "
                        "LlamaConfig fields")
    r.add_argument("--model-dir", help="use this HF model directory instead of making one")
    r.add_argument("--data", help="where the model and tokens are made and reused (default: "
                                  "--out); same rule as --out")
    r.add_argument("--configs", help="comma-separated: " + ", ".join(list(OURS) + list(THEIRS))
                   + " (default: ours-alst,hf and ds-zero3 when DeepSpeed imports)")
    r.add_argument("--parts", default="throughput,maxlen", help="throughput, maxlen or both")
    r.add_argument("--lengths", help="throughput lengths (default 4096,16384)")
    r.add_argument("--reps", type=int, default=3, help="interleaved repeats per length")
    r.add_argument("--warmup", type=int, default=1, help="steps left out of the median")
    r.add_argument("--steps", type=int, default=3, help="measured steps per run")
    r.add_argument("--maxlen-configs", help="configurations searched (default: --configs)")
    r.add_argument("--start", type=int, default=4096, help="first length of the search")
    r.add_argument("--max-length", type=int, help="search ceiling (default 16 x longest length)")
    r.add_argument("--resolution", type=float, default=0.125,
                   help="stop bisecting when the bracket is within this fraction of the longest")
    r.add_argument("--granule", type=int, default=1024, help="lengths are multiples of this")
    r.add_argument("--limit-gib", type=float, default=0.0,
                   help="per-process memory cap (needed on CPU for the search; 0 on GPU = the "
                        "whole device)")
    r.add_argument("--peak-tflops", type=float, default=0.0, help="dense peak per device")
    r.add_argument("--hardware", help="profiles/hardware preset or path: its peak_tflops")
    r.add_argument("--timeout", type=float, default=900, help="seconds per throughput run")
    r.add_argument("--probe-timeout", type=float, default=600, help="seconds per search probe")
    r.add_argument("--budget-s", type=float, default=0,
                   help="seconds per configuration's search; past it the bracket so far is "
                        "reported (0 = none)")
    r.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"),
                   help="directory of ulysses-train")
    r.add_argument("--python",
                   help="Python with torch and transformers (and DeepSpeed) for the baseline "
                        "(default: this one when it imports them, else the project's .venv)")
    r.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "0"))
                   or os.cpu_count())
    t = sub.add_parser("table", help="print the tables of a results.jsonl")
    t.add_argument("results")
    args = p.parse_args()
    if args.command == "table":
        with open(args.results) as f:
            print(table([json.loads(x) for x in f if x.strip()]))
        return 0
    args.parts = args.parts.split(",")
    return cmd_run(args)


if __name__ == "__main__":
    sys.exit(main())
