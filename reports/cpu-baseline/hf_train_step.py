#!/usr/bin/env python3
"""One process = one transformers training run, the baseline for ulysses-train on CPU.

LlamaForCausalLM.from_pretrained(MODEL_DIR) (fp32, SDPA attention), torch.optim.AdamW and
clip_grad_norm_ with the same hyper-parameters as the ulysses-train run config of run.sh, trained
for --steps steps on samples [s-1, s) (micro batch 1) of a flat uint16 token file (sample i =
tokens [i*L, (i+1)*L), labels = next token within the sample, as ulysses-train reads it).
Writes one JSON object to --out: per-step loss and milliseconds, peak RSS (getrusage ru_maxrss of
this process: the whole process, libraries included) and the status.

--limit-gib X caps the address space the way ulysses-train's memory.limit_gib does on CPU: after
the imports and after the intra-op thread pool started, RLIMIT_AS = (current virtual size) + X GiB.
An allocation past it fails; this script then writes status "oom" and exits 12 (ulysses-train's
out-of-memory status).
"""
import argparse
import json
import os
import resource
import sys
import time


def vm_size_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def is_oom(error):
    text = str(error)
    return isinstance(error, MemoryError) or any(
        s in text for s in ("can't allocate memory", "DefaultCPUAllocator", "out of memory",
                            "std::bad_alloc", "Cannot allocate memory"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--tokens", required=True, help="flat little-endian uint16 token file")
    p.add_argument("--length", type=int, required=True)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--checkpointing", choices=["on", "off"], default="off")
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    p.add_argument("--limit-gib", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    result = {"status": "error", "length": args.length, "checkpointing": args.checkpointing,
              "threads": args.threads, "limit_gib": args.limit_gib, "steps": [], "step_ms": [],
              "loss": []}

    def finish(status, code, message=""):
        result["status"] = status
        result["message"] = message[:500]
        result["peak_rss_bytes"] = peak_rss_bytes()
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        sys.exit(code)

    import numpy as np
    import torch
    import transformers
    from transformers import LlamaForCausalLM

    torch.set_num_threads(args.threads)
    result["torch"] = torch.__version__
    result["transformers"] = transformers.__version__
    torch.mm(torch.ones(64, 64), torch.ones(64, 64))  # start the intra-op thread pool
    if args.limit_gib > 0:
        base = vm_size_bytes()
        cap = base + int(args.limit_gib * (1 << 30))
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
        result["rlimit_as_bytes"] = cap
        result["baseline_vm_bytes"] = base

    try:
        tokens = np.memmap(args.tokens, dtype="<u2", mode="r")
        model = LlamaForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32,
                                                 attn_implementation="sdpa")
        model.config.use_cache = False
        if args.checkpointing == "on":
            model.gradient_checkpointing_enable()
        model.train()
        params = [q for q in model.parameters() if q.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                                      weight_decay=0.0)
        result["attn_implementation"] = model.config._attn_implementation
        result["gradient_checkpointing"] = bool(model.is_gradient_checkpointing)
        L = args.length
        for step in range(1, args.steps + 1):
            ids = torch.from_numpy(np.array(tokens[(step - 1) * L:step * L], dtype=np.int64))
            ids = ids.view(1, L)
            t0 = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            ms = (time.perf_counter() - t0) * 1e3
            result["steps"].append(step)
            result["step_ms"].append(ms)
            result["loss"].append(loss.item())
            del loss
    except Exception as e:  # noqa: BLE001 - classify, then report
        if is_oom(e):
            finish("oom", 12, f"{type(e).__name__}: {e}")
        finish("error", 1, f"{type(e).__name__}: {e}")
    finish("ok", 0)


if __name__ == "__main__":
    main()
