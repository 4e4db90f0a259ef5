#!/usr/bin/env python3
"""One rank of a trial of the deepspeed backend: the run config a sweep wrote (run.yaml, the
schema ulysses-train reads) trained by Hugging Face transformers under DeepSpeed's own Ulysses
sequence parallelism (UlyssesSPAttentionHF), TiledMLP, tiled loss (sequence_tiled_compute),
gradient checkpointing and the ZeRO stage and offloads of the ds_config.json that `ulysses-tune
export --format deepspeed` writes for it. Started like ulysses-train, one process per rank with
torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), and writes what
it writes: output.dir/metrics.jsonl and summary.json (docs/outputs.md), and the same exit
statuses (0 ok, 2 bad input, 12 out of memory, 13 a peer or a collective failed, 1 otherwise).

  ds_trial.py --config RUN/run.yaml --ds-config RUN/ds_config.json

Data: data.source must be tokens:PATH (the sweep writes the run's samples there): sample i is
tokens [i*L, (i+1)*L), its labels the next token within the sample; step s trains samples
[(s-1)G, sG), G = dp x micro_batch x grad_accum, dp rank d taking [d*mb*ga, (d+1)*mb*ga) of them,
micro-step by micro-step, as ulysses-train does. The loss is ulysses-train's: the sum of the token
cross-entropies over every valid label of the global batch divided by their count.
"""
import argparse
import contextlib
import importlib
import json
import math
import os
import resource
import statistics
import sys
import time

EXIT_USAGE, EXIT_OOM, EXIT_COMM = 2, 12, 13

# The model families (model_type) ulysses-train trains, with what their transformers config needs
# beyond the shapes for inline models: no sliding window (ulysses-train refuses one shorter than
# the sequence, and a longer one masks nothing).
FAMILIES = {"llama": {}, "mistral": {"sliding_window": None},
            "qwen2": {"use_sliding_window": False}, "qwen3": {"use_sliding_window": False}}


class BadInput(Exception):
    """One line naming the run-config key and what is wrong."""


def fail(code, text):
    sys.stderr.write(text.rstrip("\n") + "\n")
    sys.stderr.flush()
    os._exit(code)  # a rank that stops must not wait for the others in atexit handlers


# Set once the address space is capped (memory.limit_gib on CPU): then a C extension whose
# allocation fails can surface as a SystemError without an exception set instead of MemoryError.
ADDRESS_SPACE_CAPPED = False


def is_oom(error):
    text = str(error)
    if ADDRESS_SPACE_CAPPED and isinstance(error, SystemError) and "without exception set" in text:
        return True
    # Under the cap a new thread's stack and malloc arena can find no address space left, and
    # thread creation (Gloo's process groups start several) fails with EAGAIN.
    if ADDRESS_SPACE_CAPPED and "Resource temporarily unavailable" in text:
        return True
    return (isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError" or
            any(s in text for s in ("out of memory", "can't allocate memory", "DefaultCPUAllocator",
                                    "std::bad_alloc", "Cannot allocate memory")))


def is_comm(error):
    text = str(error).lower()
    return any(s in text for s in ("connection reset", "connection closed", "gloo", "nccl",
                                   "timed out", "broken pipe", "peer"))


def proc_status_bytes(field):
    """A size from /proc/self/status: "VmRSS" (resident now) or "VmSize" (address space)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def section(config, name):
    value = config.get(name) or {}
    if not isinstance(value, dict):
        raise BadInput(f"{name}: expected a mapping")
    return value


def check_config(run):
    """The run-config keys this backend cannot honour, each refused in one line."""
    data = section(run, "data")
    source = str(data.get("source", "synthetic"))
    if not source.startswith("tokens:"):
        raise BadInput(f"data.source: the deepspeed backend reads tokens:PATH (the sweep writes the "
                       f"run's samples to one), got '{source}'")
    if data.get("pack"):
        raise BadInput("data.pack: the deepspeed backend trains unpacked samples")
    model = section(run, "model")
    if model.get("preset"):
        raise BadInput("model.preset: the deepspeed backend builds the model from model.load or "
                       "the inline model.* shapes")
    if str(section(run, "attention").get("backend", "auto")) not in ("auto", "sdpa", "math"):
        raise BadInput("attention.backend: the deepspeed backend runs transformers' sdpa")
    sp, heads = int(section(run, "mesh").get("sp", 1)), int(model.get("num_heads", 0) or 0)
    if heads and heads % sp != 0:
        raise BadInput(f"mesh.uneven_heads: DeepSpeed's Ulysses needs mesh.sp {sp} to divide "
                       f"model.num_heads {heads}; only ulysses-train splits the heads unevenly")


class PhaseTimes:
    """Inclusive milliseconds per named scope of one step, as ulysses-train's `phases`: CUDA events
    on a GPU (read once the step has synchronized, so timing adds no host sync), the clock on CPU."""

    def __init__(self, torch, cuda):
        self.torch, self.cuda, self.spans = torch, cuda, []

    @contextlib.contextmanager
    def scope(self, name):
        if self.cuda:
            start, end = (self.torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            yield
            end.record()
            self.spans.append((name, start, end))
        else:
            start = time.perf_counter()
            yield
            self.spans.append((name, 1000.0 * (time.perf_counter() - start), None))

    def take(self):
        """The step's {name: ms}, summed over the scope's occurrences; starts the next step.
        REQUIRES on a GPU: the step's work synchronized."""
        phases = {}
        for name, start, end in self.spans:
            ms = start.elapsed_time(end) if self.cuda else start
            phases[name] = phases.get(name, 0.0) + ms
        self.spans = []
        return phases


def mlp_tiles_of(value, local_length, hidden):
    """memory.tiled_mlp as ulysses-train resolves it: N, or auto = ceil(local length / hidden)."""
    if str(value) == "auto":
        return max(1, math.ceil(local_length / hidden))
    return max(1, int(value))


AUTO_LOSS_TILE_BYTES = 1 << 30  # ulysses-train's auto: tiles of at most 1 GiB of fp32 logits


def loss_tiles_of(value, batch, local_length, vocab):
    """memory.tiled_loss as ulysses-train resolves it: N, or auto = the fp32 logits in tiles of
    at most AUTO_LOSS_TILE_BYTES (at least 1, at most one token per tile)."""
    if str(value) == "auto":
        tiles = math.ceil(batch * local_length * vocab * 4 / AUTO_LOSS_TILE_BYTES)
        return min(max(tiles, 1), local_length)
    return max(1, int(value))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="run.yaml: the trial's run config")
    p.add_argument("--ds-config", required=True, help="ds_config.json for this run config")
    args = p.parse_args()

    import yaml
    try:
        with open(args.config) as f:
            run = yaml.safe_load(f) or {}
        with open(args.ds_config) as f:
            ds_config = json.load(f)
        check_config(run)
    except BadInput as e:
        fail(EXIT_USAGE, f"error: {e}")
    except (OSError, ValueError, yaml.YAMLError) as e:
        fail(EXIT_USAGE, f"error: {e}")

    train = section(run, "train")
    device = str(train.get("device", "cpu"))
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported
    import numpy as np
    import torch
    import torch.distributed as dist
    import deepspeed
    import transformers
    from deepspeed.runtime.sequence_parallel.ulysses_sp import (TiledMLP, UlyssesSPAttentionHF,
                                                                sequence_tiled_compute)
    from transformers import AutoConfig, AutoModelForCausalLM

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    mesh, sequence, memory = section(run, "mesh"), section(run, "sequence"), section(run, "memory")
    sp, dp = int(mesh.get("sp", 1)), int(mesh.get("dp", 1))
    if sp * dp != world:
        fail(EXIT_USAGE, f"error: mesh.dp: dp {dp} x sp {sp} is not the {world} ranks started")
    length = int(sequence["length"])
    mb, ga = int(sequence.get("micro_batch", 1)), int(sequence.get("grad_accum", 1))
    steps = int(train.get("steps", 1))
    warmup = int(section(run, "profile").get("warmup_steps", 1))
    limit_gib = float(memory.get("limit_gib", 0) or 0)
    bf16 = str(memory.get("precision", "fp32")) == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    # The family (model.load's model_type, else model.family). transformers imports a family's
    # modeling code only when a model is built; it is imported here, before the baseline, so that
    # the baseline holds all the code the rank loads, as ulysses-train's does.
    model_options = section(run, "model")
    load = str(model_options.get("load", "") or "")
    if load:
        with open(os.path.join(load, "config.json")) as f:
            family, key = json.load(f).get("model_type", "llama"), "model.load: model_type"
    else:
        family, key = str(model_options.get("family", "llama")), "model.family"
    if family not in FAMILIES:
        fail(EXIT_USAGE, f"error: {key}: '{family}' is not supported "
                         f"(supported: {', '.join(FAMILIES)})")
    importlib.import_module(f"transformers.models.{family}.modeling_{family}")

    # DeepSpeed's C++ ops (ds_ops.py): the sweep built them before its first trial, so they only
    # load here; code, so before the baseline too. A lock left in an op's build directory by a
    # build that was killed would make the load wait forever: it is named instead.
    import ds_ops
    lock = ds_ops.load_trial_ops(ds_config)
    if lock:
        fail(EXIT_USAGE, f"error: {ds_ops.stale_lock_message(lock)}")

    # The process before the model: what peak_mem_bytes counts above (summary memory_baseline_bytes).
    baseline = proc_status_bytes("VmRSS")
    # What memory.limit_gib caps on CPU: the address space above this size (summary
    # max_rank_peak_address_space_bytes).
    address_space_baseline = proc_status_bytes("VmSize")
    cap = None
    if limit_gib > 0 and device == "cpu":
        cap = address_space_baseline + int(limit_gib * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        global ADDRESS_SPACE_CAPPED
        ADDRESS_SPACE_CAPPED = True
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        if limit_gib > 0:
            total = torch.cuda.get_device_properties(local_rank).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, limit_gib * (1 << 30) / total))

    deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
    workarounds = []

    # The model: the checkpoint of model.load, or the inline shapes with transformers' init; the
    # family's own transformers class either way.
    if load:
        model = AutoModelForCausalLM.from_pretrained(load, dtype=dtype, attn_implementation="sdpa")
        weights = "loaded"
    else:
        torch.manual_seed(int(model_options.get("init_seed", 0)))
        hidden = int(model_options["hidden_size"])
        heads = int(model_options["num_heads"])
        rope = {"rope_type": "default", "rope_theta": float(model_options.get("rope_theta", 1e4))}
        if model_options.get("rope_scaling_type"):
            rope.update(
                rope_type=str(model_options["rope_scaling_type"]),
                factor=float(model_options["rope_scaling_factor"]),
                low_freq_factor=float(model_options["rope_low_freq_factor"]),
                high_freq_factor=float(model_options["rope_high_freq_factor"]),
                original_max_position_embeddings=int(model_options["rope_original_max_position"]))
        config = AutoConfig.for_model(
            family, hidden_size=hidden, num_hidden_layers=int(model_options["num_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(model_options.get("num_kv_heads", heads)),
            head_dim=int(model_options.get("head_dim", 0) or hidden // heads),
            intermediate_size=int(model_options["intermediate_size"]),
            vocab_size=int(model_options["vocab_size"]),
            rms_norm_eps=float(model_options.get("rms_norm_eps", 1e-5)),
            rope_parameters=rope,
            tie_word_embeddings=bool(model_options.get("tie_embeddings", False)),
            max_position_embeddings=int(model_options.get("max_position_embeddings", 131072)),
            attn_implementation="sdpa",
            **FAMILIES[family])
        model = AutoModelForCausalLM.from_config(config).to(dtype)
        weights = "transformers-init"
    if device == "cuda":
        model = model.to(f"cuda:{local_rank}")
    hidden = model.config.hidden_size
    vocab = model.config.vocab_size

    local_length = length // sp
    if length % sp != 0:
        fail(EXIT_USAGE, f"error: sequence.length: {length} is not a multiple of mesh.sp {sp} "
                         "(the deepspeed backend does not pad)")
    mlp_tiles = mlp_tiles_of(memory.get("tiled_mlp", 1), local_length, hidden)
    loss_tiles = loss_tiles_of(memory.get("tiled_loss", 1), mb, local_length, vocab)
    if mlp_tiles > 1:
        def tiled_mlp_forward(self, x):
            def mlp(module, shard):
                return module.down_proj(module.act_fn(module.gate_proj(shard)) * module.up_proj(shard))
            params = [self.down_proj.weight, self.gate_proj.weight, self.up_proj.weight]
            return TiledMLP.apply(mlp, self, x, mlp_tiles, params)
        for layer in model.model.layers:
            layer.mlp.forward = tiled_mlp_forward.__get__(layer.mlp)
    # from_pretrained leaves the model in eval mode, where transformers skips checkpointing.
    model.train()
    offload_activations = bool(memory.get("offload_activations"))
    if offload_activations and device == "cuda":
        # transformers' checkpointing with the saved layer inputs in pinned host memory (torch's
        # save_on_cpu). DeepSpeed's own (deepspeed.checkpointing with cpu_checkpointing) restores
        # a Llama layer's input with the wrong shape in backward.
        model.activation_checkpointing_enable(offload=True)
    elif memory.get("checkpointing") or offload_activations:
        # On CPU the checkpoints are in host memory already: offloading is checkpointing.
        model.activation_checkpointing_enable()
    # Decoder layer forwards, counted at their first norm (the layer's own hooks stay outside the
    # checkpoint): twice per micro-step and layer when the layers recompute in backward.
    layer_calls = [0]
    for layer in model.model.layers:
        layer.input_layernorm.register_forward_pre_hook(
            lambda *_: layer_calls.__setitem__(0, layer_calls[0] + 1))

    mpu = None
    if sp > 1:
        mpu = UlyssesSPAttentionHF.register_with_transformers(
            model_name_or_path=model, core_attn_implementation="sdpa", sequence_parallel_size=sp,
            micro_batch_size=mb, seq_length=length, seq_length_is_variable=False)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=ds_config, mpu=mpu)
    sp_rank = rank % sp  # SP groups are contiguous ranks (ds_config's data_parallel x sequence_parallel)
    dp_rank = rank // sp

    # The engine sums gradients over all dp x sp ranks and divides by dp (DeepSpeed's
    # sequence-data-parallel reduction) and divides each micro-step's loss by grad_accum; each rank
    # backpropagates its own tokens' share of ulysses-train's loss, scaled to undo both.
    loss_scale = dp * ga
    if sp > 1:
        workarounds.append(
            "loss: each rank backpropagates the cross-entropy sum of its own tokens / the global "
            "batch's label count x dp x grad_accum (DeepSpeed sums gradients over dp x sp ranks "
            "and divides by dp); an all-gathered, sp-averaged loss as ArcticTraining computes it "
            "makes the gradients sp times too large, and gloo's all_gather backward picks the "
            "wrong rank when the sp group is not the world")
    zero_stage = int(ds_config.get("zero_optimization", {}).get("stage", 0))
    if zero_stage == 3 and sp > 1 and ds_config["zero_optimization"].get("reduce_scatter", True):
        # ZeRO-3's reduce-scatter divides every gradient by the whole world, dp x sp, where the
        # other stages (and its own all-reduce path) divide by dp: its gradients come out sp times
        # too small, whatever the loss.
        loss_scale *= sp
        workarounds.append(
            "zero-3 gradients: each rank's loss scaled by sp as well (DeepSpeed's stage-3 "
            "reduce-scatter averages gradients over the dp x sp ranks, not dp, so under sequence "
            "parallelism its gradients are sp times too small)")

    data = section(run, "data")
    token_dtype = "<u4" if str(data.get("token_dtype", "uint16")) == "uint32" else "<u2"
    tokens = np.memmap(str(data["source"])[len("tokens:"):], dtype=token_dtype, mode="r")
    global_batch = dp * mb * ga

    def sample(index):
        ids = torch.from_numpy(np.array(tokens[index * length:(index + 1) * length], dtype=np.int64))
        if ids.numel() != length:
            fail(EXIT_USAGE, f"error: data.source: sample {index} is past the end of the file")
        labels = torch.full_like(ids, -100)
        labels[:-1] = ids[1:]
        return ids, labels

    def local_loss(hidden_states, labels):
        """Sum of the cross-entropies of this rank's tokens, over loss_tiles sequence tiles."""
        lm_head = engine.module.lm_head

        def tile_loss(hidden_states, labels):
            logits = lm_head(hidden_states).float()
            return torch.nn.functional.cross_entropy(
                logits.view(-1, vocab), labels.reshape(-1), ignore_index=-100, reduction="sum")

        if loss_tiles == 1:
            return tile_loss(hidden_states, labels)
        # DeepSpeed's TiledFusedLogitsLoss gives a wrong lm_head gradient (0.19.8): the tiles go
        # through sequence_tiled_compute instead (named in summary.json "workarounds").
        return sequence_tiled_compute(
            tile_loss, local_length, loss_tiles, {"hidden_states": hidden_states, "labels": labels},
            {}, "hidden_states", compute_params=[lm_head.weight], output_unshard_dimension=0,
            output_reduction="sum")

    if mb > 1 and sp > 1:
        workarounds.append(
            "labels: each rank's [micro_batch, length/sp] slice made contiguous (transformers' and "
            "DeepSpeed's causal-LM losses flatten labels with view, which fails on a column slice)")
    if loss_tiles > 1:
        workarounds.append(
            "tiled loss: lm_head + cross-entropy tiled by sequence_tiled_compute, not "
            "TiledFusedLogitsLoss, whose lm_head gradient is wrong")
    out_dir = str(section(run, "output").get("dir", "out"))
    if rank == 0:
        os.makedirs(out_dir, exist_ok=True)
    records = []
    target = torch.device(f"cuda:{local_rank}" if device == "cuda" else "cpu")
    phases = PhaseTimes(torch, device == "cuda")
    for step in range(1, steps + 1):
        first = (step - 1) * global_batch
        # Every label of the global batch: all but each sample's last position.
        valid = global_batch * (length - 1)
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        loss_sum = torch.zeros((), dtype=torch.float64, device=target)  # summed without a sync
        for micro in range(ga):
            # The micro-batch's rows: ulysses-train's DataLoader::sample_index.
            rows = [sample(first + dp_rank * mb * ga + micro * mb + row) for row in range(mb)]
            chunk = slice(sp_rank * local_length, (sp_rank + 1) * local_length)
            input_ids = torch.stack([ids for ids, _ in rows])[:, chunk].to(target)  # [bs, sl/sp]
            # [bs, sl/sp], contiguous: a column slice of [bs, sl] is not when bs > 1, and the
            # losses users take from transformers (ForCausalLMLoss) and DeepSpeed
            # (TiledFusedLogitsLoss) flatten labels with view(-1), which fails on it.
            shift_labels = torch.stack([labels for _, labels in rows])[:, chunk].contiguous()
            shift_labels = shift_labels.to(target)
            position_ids = torch.arange(length)[chunk].expand(mb, -1).to(target)  # [bs, sl/sp]
            if hasattr(engine.optimizer, "clear_backward_seen_flag"):
                # What engine.forward does first, which this loop bypasses to take the hidden
                # states for the tiled loss: ZeRO's optimizers count micro-steps there (stage 3
                # overwrites its gradient partitions instead of accumulating them without it).
                engine.optimizer.clear_backward_seen_flag()
            with phases.scope("forward"):
                outputs = engine.module.model(input_ids=input_ids, position_ids=position_ids)
                with phases.scope("loss"):
                    local = local_loss(outputs.last_hidden_state, shift_labels)
            loss_sum += local.detach().double()
            with phases.scope("backward"):  # at the last micro-step: DeepSpeed's reductions too
                engine.backward(local * (loss_scale / valid))
            if micro == ga - 1 and zero_stage == 0:
                # Stage 0 reduced whole gradients in the boundary's backward; the engine keeps
                # no norm of them, so it is taken here, before clipping and the update.
                squares = sum(p.grad.double().pow(2).sum()
                              for p in engine.module.parameters() if p.grad is not None)
                grad_norm = float(squares.sqrt())  # one host sync per step
            with phases.scope("optimizer"):  # a no-op but at the last micro-step
                engine.step()
        if zero_stage > 0:
            grad_norm = engine.get_global_grad_norm()  # the ZeRO optimizer's, before clipping
        if device == "cuda":
            torch.cuda.synchronize()
        step_ms = 1000.0 * (time.perf_counter() - start)
        step_phases = phases.take()
        dist.all_reduce(loss_sum)  # every rank's tokens: the global batch's sum
        loss = float(loss_sum) / valid
        if device == "cuda":
            peak = int(torch.cuda.max_memory_reserved())
        else:
            peak = peak_rss_bytes()
        tokens_step = global_batch * length
        lr = engine.get_lr()[0] if engine.get_lr() else 0.0
        records.append({
            "step": step, "loss": loss,
            "grad_norm": float(grad_norm) if grad_norm is not None else None,
            "lr": lr, "tokens": tokens_step, "valid_tokens": valid, "step_ms": step_ms,
            "tokens_per_s": tokens_step / (step_ms / 1000.0),
            "tokens_per_s_per_rank": tokens_step / (step_ms / 1000.0) / world,
            "peak_mem_bytes": peak, "peak_host_bytes": peak_rss_bytes(), "first_sample": first,
            "phases": step_phases})

    # VmPeak counts from the process start; no mapping passes the cap once it is set.
    address_space_peak = proc_status_bytes("VmPeak")
    if cap is not None:
        address_space_peak = min(address_space_peak, cap)
    peaks = torch.tensor([max(r["peak_mem_bytes"] for r in records),
                          max(r["peak_host_bytes"] for r in records),
                          max(0, address_space_peak - address_space_baseline)],
                         dtype=torch.float64)
    dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
    if rank == 0:
        measured = records[warmup:] if len(records) > warmup else records
        summary = {
            "backend": "deepspeed", "steps": len(records), "measured_steps": len(measured),
            "warmup_steps": warmup,
            "step_ms_median": statistics.median(r["step_ms"] for r in measured),
            "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in measured),
            "tokens_per_s_per_rank_median":
                statistics.median(r["tokens_per_s_per_rank"] for r in measured),
            "phases_ms_median": {name: statistics.median(r["phases"].get(name, 0.0)
                                                         for r in measured)
                                 for name in measured[-1]["phases"]},
            "peak_mem_bytes": max(r["peak_mem_bytes"] for r in records),
            "peak_host_bytes": max(r["peak_host_bytes"] for r in records),
            "max_rank_peak_mem_bytes": int(peaks[0]), "max_rank_peak_host_bytes": int(peaks[1]),
            "memory_baseline_bytes": baseline if device == "cpu" else 0,
            **({"max_rank_peak_address_space_bytes": int(peaks[2])} if device == "cpu" else {}),
            "first_loss": records[0]["loss"], "final_loss": records[-1]["loss"],
            "world_size": world, "dp": dp, "sp": sp, "sequence_length": length,
            "device": f"cuda:{local_rank}" if device == "cuda" else "cpu",
            "weights": weights, "mlp_tiles": mlp_tiles, "loss_tiles": loss_tiles,
            "zero_stage": zero_stage,
            # As docs/outputs.md's summary `memory`; checkpointing is what ran: the decoder
            # layers ran forward again in backward.
            "memory": {
                "tiled_mlp": memory.get("tiled_mlp", 1), "tiled_mlp_tiles": mlp_tiles,
                "tiled_loss": memory.get("tiled_loss", 1), "tiled_loss_tiles": loss_tiles,
                "checkpointing": layer_calls[0] > len(model.model.layers) * ga * steps,
                "zero_stage": zero_stage, "offload_activations": offload_activations,
                "offload_optimizer": "offload_optimizer" in ds_config.get("zero_optimization", {}),
                "precision": "bf16" if bf16 else "fp32", "limit_gib": limit_gib},
            "workarounds": workarounds,
            "versions": {"deepspeed": deepspeed.__version__, "transformers": transformers.__version__,
                         "torch": torch.__version__}}
        for name, text in (("metrics.jsonl", "".join(json.dumps(r) + "\n" for r in records)),
                           ("summary.json", json.dumps(summary, indent=1) + "\n")):
            path = os.path.join(out_dir, name)
            with open(path + ".tmp", "w") as f:
                f.write(text)
            os.replace(path + ".tmp", path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # the status says what happened; the last line says it in one
        import traceback
        sys.stderr.write(traceback.format_exc())
        first_line = str(e).strip().split("\n")[0][:300] or type(e).__name__
        if is_oom(e):
            capped = " (memory.limit_gib caps the address space)" if ADDRESS_SPACE_CAPPED else ""
            fail(EXIT_OOM, f"out of memory: {first_line}{capped}")
        if is_comm(e):
            fail(EXIT_COMM, f"communication failed: {first_line}")
        fail(1, f"error: {type(e).__name__}: {first_line}")
