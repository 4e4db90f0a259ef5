#!/usr/bin/env python3
"""One process = one training run of the baseline (bench/compare/README.md): Hugging Face
transformers' LlamaForCausalLM from --model-dir with SDPA attention, gradient checkpointing
(--checkpointing on) and torch.optim.AdamW (fused=True on CUDA), clipping at --grad-clip; or, with
--deepspeed, the same model under DeepSpeed ZeRO-3 with the optimizer states offloaded to the CPU
(ALST's published baseline). Trains --steps steps on samples 0, 1, ... (micro batch 1) of a flat
token file (sample i = tokens [i*L, (i+1)*L), labels = the next token within the sample, as
ulysses-train reads it) and writes one JSON object to --out: per-step loss and milliseconds, peak
memory, status (ok | oom | error) and versions.

Memory: on CUDA the caching allocator's allocated and reserved peaks (torch.cuda.max_memory_*);
on CPU the process's RSS high-water mark (getrusage). --limit-gib X caps memory the way
ulysses-train's memory.limit_gib does: on CPU RLIMIT_AS = (virtual size after the imports) + X GiB;
on CUDA torch.cuda.set_per_process_memory_fraction(X GiB / device memory). Running out of memory
(torch.cuda.OutOfMemoryError, a failed host allocation) writes status "oom" and exits 12, the
status ulysses-train uses.
"""
import argparse
import json
import os
import resource
import socket
import sys
import time


def vm_size_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def is_oom(error):
    text = str(error)
    return (isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError" or
            any(s in text for s in ("out of memory", "can't allocate memory", "DefaultCPUAllocator",
                                    "std::bad_alloc", "Cannot allocate memory")))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--tokens", required=True, help="flat little-endian token file")
    p.add_argument("--token-dtype", choices=["uint16", "uint32"], default="uint16")
    p.add_argument("--length", type=int, required=True)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--checkpointing", choices=["on", "off"], default="on")
    p.add_argument("--deepspeed", action="store_true",
                   help="DeepSpeed ZeRO-3, optimizer states offloaded to the CPU")
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    p.add_argument("--limit-gib", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    result = {"status": "error", "length": args.length, "device": args.device,
              "dtype": args.dtype, "checkpointing": args.checkpointing,
              "deepspeed": args.deepspeed, "limit_gib": args.limit_gib, "step_ms": [], "loss": []}

    def finish(status, code, message=""):
        result["status"] = status
        result["message"] = message[-800:]
        result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        if args.device == "cuda" and "torch" in sys.modules:
            torch = sys.modules["torch"]
            if torch.cuda.is_initialized():
                result["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
                result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
                free, total = torch.cuda.mem_get_info()
                # What the device holds besides this allocator's reserve (CUDA context, cuBLAS
                # workspaces, NCCL, other processes), at the end of the run.
                result["outside_allocator_bytes"] = total - free - torch.cuda.memory_reserved()
        with open(args.out + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(args.out + ".tmp", args.out)
        sys.exit(code)

    import numpy as np
    import torch
    import transformers
    from transformers import LlamaForCausalLM

    torch.set_num_threads(args.threads)
    result["torch"] = torch.__version__
    result["transformers"] = transformers.__version__
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    if args.device == "cuda":
        torch.cuda.init()
        result["device_name"] = torch.cuda.get_device_name()
    torch.mm(torch.ones(64, 64), torch.ones(64, 64))  # start the intra-op thread pool
    if args.limit_gib > 0 and args.device == "cpu":
        base = vm_size_bytes()
        cap = base + int(args.limit_gib * (1 << 30))
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
        result["rlimit_as_bytes"] = cap
    elif args.limit_gib > 0:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.limit_gib * (1 << 30) / total))

    try:
        tokens = np.memmap(args.tokens, mode="r",
                           dtype="<u2" if args.token_dtype == "uint16" else "<u4")
        model = LlamaForCausalLM.from_pretrained(args.model_dir, dtype=dtype,
                                                 attn_implementation="sdpa")
        model.config.use_cache = False
        if args.checkpointing == "on":
            model.gradient_checkpointing_enable()
        model.train()
        result["attn_implementation"] = model.config._attn_implementation
        result["gradient_checkpointing"] = bool(model.is_gradient_checkpointing)
        params = [q for q in model.parameters() if q.requires_grad]
        hyper = dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
        if args.deepspeed:
            engine = deepspeed_engine(args, model, params, hyper, result)
        else:
            model.to(device)
            fused = args.device == "cuda"
            optimizer = torch.optim.AdamW(params, fused=fused, **hyper) if fused else \
                torch.optim.AdamW(params, **hyper)
            result["optimizer"] = "torch.optim.AdamW" + (" (fused)" if fused else "")
        length = args.length
        for step in range(1, args.steps + 1):
            ids = torch.from_numpy(
                np.array(tokens[(step - 1) * length:step * length], dtype=np.int64))
            ids = ids.view(1, length).to(device)
            if args.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            if args.deepspeed:
                loss = engine(input_ids=ids, labels=ids).loss
                engine.backward(loss)
                engine.step()
            else:
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            loss_value = loss.item()
            if args.device == "cuda":
                torch.cuda.synchronize()
            result["step_ms"].append((time.perf_counter() - t0) * 1e3)
            result["loss"].append(loss_value)
            del loss
    except Exception as e:  # noqa: BLE001 - classify, then report
        if is_oom(e):
            finish("oom", 12, f"{type(e).__name__}: {e}")
        finish("error", 1, f"{type(e).__name__}: {e}")
    finish("ok", 0)


def deepspeed_engine(args, model, params, hyper, result):
    """DeepSpeed ZeRO-3 on one process, optimizer states on the CPU (torch's AdamW as the client
    optimizer, so no DeepSpeed op has to be compiled)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    import deepspeed
    import deepspeed.comm.torch  # noqa: F401 - the module, for the line below
    import torch

    # One process has no peer to share memory with: skip the CPU backend's shared-memory
    # collective, which DeepSpeed would otherwise compile on first use. (`deepspeed.comm.torch`
    # as an attribute is the torch package; the module is in sys.modules.)
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    result["deepspeed_version"] = deepspeed.__version__
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": args.grad_clip,
        "zero_optimization": {"stage": 3,
                              "offload_optimizer": {"device": "cpu",
                                                    "pin_memory": args.device == "cuda"}},
        "zero_force_ds_cpu_optimizer": False,
        "bf16": {"enabled": args.dtype == "bf16"},
    }
    optimizer = torch.optim.AdamW(params, **hyper)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    result["optimizer"] = "DeepSpeed ZeRO-3, offload_optimizer cpu, torch.optim.AdamW"
    return engine


if __name__ == "__main__":
    main()
