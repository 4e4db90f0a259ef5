#!/usr/bin/env python3
"""Checks ulysses-tune's export files (tuner/export/) with the consumers' own config code.

Usage: check_exports.py CASE_DIR [CASE_DIR ...]

Each CASE_DIR holds ds_config.json, arctic_training.yaml and accelerate_config.yaml as
tuner/export/export_files.h writes them, plus expect.json: what the test that wrote them expects
the consumers to compute (world, dp, sp, micro_batch, grad_accum, train_batch_size, zero_stage,
offload_optimizer, bf16, grad_clip, lr, betas, eps, weight_decay, tiled_mlp, offload_activations,
checkpointing, seq_length, train_steps, warmup_steps, schedule, min_lr, model_load, family: the
model's HF model_type, llama when absent).

Consumers (never an imitation of their rules):
  ds_config.json          deepspeed.runtime.config.DeepSpeedConfig, twice: with the
                          (data_parallel, sequence_parallel) device mesh deepspeed.initialize
                          builds from the file's sizes, and with the Ulysses mpu (parallel_state_sp)
                          that ALST passes; its scheduler is built by DeepSpeedEngine's own
                          _scheduler_from_config.
  arctic_training.yaml      arctic_training.config.trainer.get_config (the pydantic TrainerConfig of
                          the recipe's trainer type, which also builds its DeepSpeed dict), that
                          dict through DeepSpeedConfig with the Ulysses mpu, the scheduler from
                          ArcticTraining's HFSchedulerFactory.create_scheduler, and the model's
                          family as its tiled-MLP patch finds it (tiled_compute.get_model_type on
                          name_or_path, then the <Family>MLP class enable_tiled_mlp_compute
                          patches, looked up but not patched).
  accelerate_config.yaml  accelerate's load_config_from_file (ClusterConfig), the `accelerate
                          launch` path (_validate_launch_command, prepare_deepspeed_cmd_env), then,
                          under the launcher's environment, ParallelismConfig() (as Accelerator()
                          builds it) with _validate_accelerator, and DeepSpeedPlugin() whose config
                          goes through DeepSpeedConfig with the Ulysses mpu.
The world of each case is a fake process group (torch.testing._internal.distributed.fake_pg) of
the target size: one process stands in for rank 0 of `world` ranks, no collective runs.

Prints one line per file checked ("OK <file>: ..." or "FAIL <file>: ..."), then what was not
checked and why ("SKIPPED ..."). Exit status: 0 when every file passed, 1 when any failed, 2 on
bad usage. Library logs go to stderr.
"""

import atexit
import contextlib
import copy
import json
import math
import os
import shutil
import sys
import tempfile
import traceback
import types
from pathlib import Path

# Offline and quiet before any consumer is imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Results go to the real stdout; everything the libraries print goes to stderr.
RESULTS = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

MODEL_PLACEHOLDER = "REPLACE_WITH_HF_MODEL_NAME_OR_PATH"  # tuner/export/arctic_recipe.h
DATA_PLACEHOLDER = "REPLACE_WITH_HF_TEXT_DATASET"

import torch  # noqa: E402
import torch.distributed as torch_dist  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.ops  # noqa: E402

# On the CPU accelerator, starting DeepSpeed's comm backend JIT-compiles its shared-memory
# collective op (minutes on a cold cache). Config validation runs no collective, so mark the op
# unavailable, as DeepSpeed does itself on machines that cannot build it (the probed dict is
# cached in the module, and DeepSpeed documents that edits to it persist).
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

import deepspeed.comm as ds_dist  # noqa: E402
import deepspeed.runtime.sequence_parallel.parallel_state_sp as ulysses_groups  # noqa: E402
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402
from deepspeed.runtime.engine import DeepSpeedEngine  # noqa: E402


class CheckFailed(Exception):
    pass


def expect(condition, what):
    if not condition:
        raise CheckFailed(what)


def expect_equal(name, got, want):
    if isinstance(want, float) or isinstance(got, float):
        ok = math.isclose(float(got), float(want), rel_tol=1e-12, abs_tol=0.0)
    else:
        ok = got == want
    if not ok:
        raise CheckFailed(f"{name} = {got!r}, expected {want!r}")


@contextlib.contextmanager
def environment(env):
    """The process environment replaced by `env` for the block (the launcher's child env)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def working_directory(path):
    saved = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(saved)


def enter_world(world):
    """A fake process group of `world` ranks (this process is rank 0), DeepSpeed comm on top."""
    if torch_dist.is_initialized():
        ds_dist.destroy_process_group()  # also releases DeepSpeed's group caches and SP groups
    torch_dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    os.environ.update(WORLD_SIZE=str(world), RANK="0", LOCAL_RANK="0")
    expect_equal("torch.distributed world size", torch_dist.get_world_size(), world)


def ulysses_mpu(sp):
    """The mpu ALST hands to deepspeed.initialize: what UlyssesSPAttentionHF.
    register_with_transformers returns (None for sp == 1, else parallel_state_sp set up)."""
    if sp == 1:
        return None
    ulysses_groups._release_sequence_parallel_groups()
    ulysses_groups.initialize_sequence_parallel(sequence_parallel_size=sp)
    return ulysses_groups


def expect_batch(config, exp, route):
    expect_equal(f"{route}: DeepSpeed data-parallel world_size", float(config.world_size),
                 float(exp["dp"]))
    expect_equal(f"{route}: train_batch_size", config.train_batch_size, exp["train_batch_size"])
    expect_equal(f"{route}: train_micro_batch_size_per_gpu",
                 config.train_micro_batch_size_per_gpu, exp["micro_batch"])
    expect_equal(f"{route}: gradient_accumulation_steps", config.gradient_accumulation_steps,
                 exp["grad_accum"])


def expect_zero(config, exp, route):
    expect_equal(f"{route}: zero_optimization_stage", int(config.zero_optimization_stage),
                 exp["zero_stage"])
    offload = config.zero_config.offload_optimizer
    device = "none" if offload is None else str(getattr(offload.device, "value", offload.device))
    if exp["offload_optimizer"]:
        expect(device == "cpu" and offload.pin_memory,
               f"{route}: offload_optimizer is {offload!r}, expected cpu with pin_memory")
    else:
        expect(device == "none", f"{route}: offload_optimizer is {offload!r}, expected none")


def run_lr_schedule(scheduler, optimizer, steps):
    """The learning rate before each of `steps` scheduler steps, and after the last."""
    rates = [optimizer.param_groups[0]["lr"]]
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        rates.append(optimizer.param_groups[0]["lr"])
    return rates


def dummy_optimizer(lr):
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def expected_final_lr(exp):
    return exp["lr"] if exp["schedule"] == "constant" else exp["min_lr"]


def check_deepspeed(case, exp):
    path = case / "ds_config.json"
    raw = json.loads(path.read_text())
    enter_world(exp["world"])

    # deepspeed.initialize: with sequence_parallel_size and data_parallel_size in the config it
    # builds this device mesh and hands it to DeepSpeedConfig.
    mesh = ds_dist.initialize_mesh_device(
        (raw["data_parallel_size"], raw["sequence_parallel_size"]),
        ("data_parallel", "sequence_parallel"))
    by_mesh = DeepSpeedConfig(str(path), mesh_device=mesh)
    expect_batch(by_mesh, exp, "mesh_device route")

    # ALST (ArcticTraining, Accelerate): the Ulysses mpu instead of a mesh.
    config = DeepSpeedConfig(str(path), mpu=ulysses_mpu(exp["sp"]))
    expect_batch(config, exp, "Ulysses mpu route")
    expect_zero(config, exp, "ds_config")
    expect_equal("bf16.enabled", bool(config.bfloat16_config.enabled), exp["bf16"])
    expect_equal("seq_parallel_communication_data_type",
                 config.seq_parallel_communication_data_type,
                 torch.bfloat16 if exp["bf16"] else torch.float32)
    expect_equal("gradient_clipping", float(config.gradient_clipping), exp["grad_clip"])
    expect_equal("optimizer type", config.optimizer_name, "adamw")
    params = config.optimizer_params
    expect_equal("optimizer lr", params["lr"], exp["lr"])
    expect_equal("optimizer betas", [float(b) for b in params["betas"]], exp["betas"])
    expect_equal("optimizer eps", params["eps"], exp["eps"])
    expect_equal("optimizer weight_decay", params["weight_decay"], exp["weight_decay"])

    needs_scheduler = not (exp["schedule"] == "constant" and exp["warmup_steps"] == 0)
    schedule_note = "no scheduler"
    if not needs_scheduler:
        expect(config.scheduler_name is None, f"unexpected scheduler {config.scheduler_name}")
    else:
        expect(config.scheduler_name is not None, "no scheduler block")
        optimizer = dummy_optimizer(exp["lr"])
        engine_view = types.SimpleNamespace(scheduler_name=lambda: config.scheduler_name,
                                            scheduler_params=lambda: config.scheduler_params)
        scheduler = DeepSpeedEngine._scheduler_from_config(engine_view, optimizer)
        # DeepSpeed's iteration counter starts at -1; the decay ends at iteration total_num_steps.
        rates = run_lr_schedule(scheduler, optimizer, exp["train_steps"] + 1)
        if exp["warmup_steps"] > 0 and exp["min_lr"] == 0.0:
            expect_equal(f"{config.scheduler_name} first lr", rates[0], 0.0)
        expect(max(rates) <= exp["lr"] * (1 + 1e-12), f"{config.scheduler_name} exceeds lr")
        expect_equal(f"{config.scheduler_name} lr after train.steps", rates[-1],
                     expected_final_lr(exp))
        schedule_note = f"{config.scheduler_name} lr 0 -> {exp['lr']:g} -> {rates[-1]:g}"

    return (f"DeepSpeedConfig dp={exp['dp']} x sp={exp['sp']} (mesh_device and Ulysses mpu): "
            f"train_batch_size={config.train_batch_size}"
            f" micro={config.train_micro_batch_size_per_gpu}"
            f" gas={config.gradient_accumulation_steps} zero={config.zero_optimization_stage}"
            f" bf16={config.bfloat16_config.enabled}; {schedule_note}")


_STANDIN_MODEL_DIRS = {}


def standin_model_dir(family):
    """A local HF model dir (config.json only) of `family` (its model_type) for the recipe's model
    placeholder, written by transformers' own config class of that family."""
    if family not in _STANDIN_MODEL_DIRS:
        from transformers import AutoConfig

        path = tempfile.mkdtemp(prefix=f"check-exports-{family}-")
        atexit.register(shutil.rmtree, path, True)
        AutoConfig.for_model(family, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                             num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                             vocab_size=1024).save_pretrained(path)
        _STANDIN_MODEL_DIRS[family] = path
    return _STANDIN_MODEL_DIRS[family]


def check_family(name_or_path, family):
    """The family as ArcticTraining's tiled MLP finds it: the model_type transformers reads from
    the checkpoint's config.json, and the MLP class enable_tiled_mlp_compute would patch (looked
    up here, not patched). Returns the names of the causal-LM class and of that MLP class."""
    import importlib

    from arctic_training.model.tiled_compute import get_causal_lm_model_cls_prefix
    from arctic_training.model.tiled_compute import get_model_type

    model_type = get_model_type(name_or_path)
    expect_equal("model_type of model.name_or_path", model_type, family)
    prefix, causal_lm = get_causal_lm_model_cls_prefix(model_type)
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    expect(hasattr(module, f"{prefix}MLP"), f"{module.__name__} has no {prefix}MLP to tile")
    expect(hasattr(module, causal_lm), f"{module.__name__} has no {causal_lm}")
    return f"{causal_lm}, {prefix}MLP"


def check_arctic(case, exp):
    from arctic_training.config.trainer import get_config
    from arctic_training.scheduler.hf_factory import HFSchedulerFactory

    enter_world(exp["world"])
    path = case / "arctic_training.yaml"
    text = path.read_text()
    notes = []
    expect(DATA_PLACEHOLDER in text, "data.sources placeholder missing")
    family = exp.get("family", "llama")
    if exp["model_load"]:
        expect(MODEL_PLACEHOLDER not in text, "model placeholder written beside model.load")
        checked = path
    else:
        expect(MODEL_PLACEHOLDER in text, "model placeholder missing")
        checked = case / ".arctic_recipe.checked.yaml"
        checked.write_text(text.replace(MODEL_PLACEHOLDER, standin_model_dir(family)))
        notes.append(f"model placeholder -> local stand-in {family} config dir")

    with working_directory(case):  # ArcticTraining writes train-log-metrics.jsonl to the cwd
        config = get_config(checked)

    expect_equal("type", config.type, "causal")
    expect_equal("micro_batch_size", config.micro_batch_size, exp["micro_batch"])
    expect_equal("gradient_accumulation_steps", config.gradient_accumulation_steps,
                 exp["grad_accum"])
    expect_equal("sequence_parallel_size", config.sequence_parallel_size, exp["sp"])
    expect_equal("tiled_mlp_compute", config.tiled_mlp_compute, exp["tiled_mlp"])
    expect_equal("activation_checkpoint_cpu_offload", config.activation_checkpoint_cpu_offload,
                 exp["offload_activations"])
    expect_equal("train_iters", config.train_iters, exp["train_steps"])
    expect_equal("model.disable_activation_checkpoint", config.model.disable_activation_checkpoint,
                 not exp["checkpointing"])
    expect_equal("model.dtype", config.model.dtype,
                 torch.bfloat16 if exp["bf16"] else torch.float32)
    if exp["model_load"]:
        expect_equal("model.name_or_path", str(config.model.name_or_path), exp["model_load"])
    notes.append(f"{family}: " + check_family(str(config.model.name_or_path), family))
    expect_equal("data.max_length", config.data.max_length, exp["seq_length"])
    expect_equal("data.sources", [s.name_or_path for s in config.data.sources], [DATA_PLACEHOLDER])
    expect_equal("optimizer.type", config.optimizer.type,
                 "cpu_adam" if exp["offload_optimizer"] else "fused_adam")
    expect_equal("optimizer.learning_rate", config.optimizer.learning_rate, exp["lr"])
    expect_equal("optimizer.betas", [float(b) for b in config.optimizer.betas], exp["betas"])
    expect_equal("optimizer.weight_decay", config.optimizer.weight_decay, exp["weight_decay"])

    # The DeepSpeed dict ArcticTraining built (batch keys from WORLD_SIZE), as its Trainer hands
    # it to deepspeed.initialize together with the Ulysses mpu.
    ds = config.deepspeed
    expect_equal("deepspeed.train_batch_size", ds["train_batch_size"], exp["train_batch_size"])
    expect_equal("deepspeed.gradient_clipping", float(ds["gradient_clipping"]), exp["grad_clip"])
    ds_config = DeepSpeedConfig(copy.deepcopy(ds), mpu=ulysses_mpu(exp["sp"]))
    expect_batch(ds_config, exp, "ArcticTraining deepspeed dict")
    expect_zero(ds_config, exp, "ArcticTraining deepspeed dict")
    expect_equal("deepspeed bf16", bool(ds_config.bfloat16_config.enabled), exp["bf16"])

    # ArcticTraining's scheduler factory, on a stand-in for the Trainer (which needs the model and
    # data): it reads trainer.training_horizon (= train_iters) and trainer.config.
    trainer_view = types.SimpleNamespace(training_horizon=config.train_iters, config=config)
    factory = HFSchedulerFactory(trainer=trainer_view, scheduler_config=config.scheduler)
    optimizer = dummy_optimizer(exp["lr"])
    scheduler = factory.create_scheduler(optimizer=optimizer)
    scale = config.sequence_parallel_size  # ArcticTraining counts scheduler steps times sp
    rates = run_lr_schedule(scheduler, optimizer, exp["train_steps"] * scale)
    warmup = min(exp["warmup_steps"], exp["train_steps"]) * scale
    if warmup > 0:
        expect(rates[warmup - 1] < exp["lr"], f"lr reaches {exp['lr']} before warmup step {warmup}")
        expect_equal(f"{config.scheduler.name} lr at the end of warmup", rates[warmup], exp["lr"])
    final = 0.0 if exp["schedule"] == "linear" else expected_final_lr(exp)
    expect_equal(f"{config.scheduler.name} lr after train_iters", rates[-1], final)

    notes.append("data source placeholder not loaded")
    return (f"{type(config).__name__}(type={config.type}) sp={config.sequence_parallel_size} "
            f"tiled_mlp={config.tiled_mlp_compute} "
            f"offload_act={config.activation_checkpoint_cpu_offload} "
            f"train_batch_size={ds['train_batch_size']:g} zero={ds_config.zero_optimization_stage}"
            f" scheduler={config.scheduler.name} warmup={warmup // scale}"
            f" ({'; '.join(notes)})")


def check_accelerate(case, exp):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils.dataclasses import DeepSpeedPlugin, DistributedType
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    enter_world(exp["world"])
    path = case / "accelerate_config.yaml"
    cluster = load_config_from_file(str(path))  # rejects unknown keys
    expect(isinstance(cluster, ClusterConfig), f"loaded as {type(cluster).__name__}")
    expect_equal("distributed_type", cluster.distributed_type, DistributedType.DEEPSPEED)
    expect_equal("num_processes", cluster.num_processes, exp["world"])

    with working_directory(case):  # deepspeed_config_file is relative to the launch directory
        # `accelerate launch --config_file FILE train.py`, as launch_command() runs it.
        args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
        args, defaults, mp_from_config = _validate_launch_command(args)
        expect(args.use_deepspeed, "accelerate launch does not pick DeepSpeed")
        fields = list(defaults.deepspeed_config.keys())
        if mp_from_config:
            fields.append("mixed_precision")
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        _, env = prepare_deepspeed_cmd_env(args)
        expect_equal("nproc_per_node", args.nproc_per_node, str(exp["world"]))

        with environment(env):  # the training processes' environment
            expect_equal("ACCELERATE_USE_PARALLELISM_CONFIG",
                         os.environ.get("ACCELERATE_USE_PARALLELISM_CONFIG"), "true")
            parallelism = ParallelismConfig()  # what Accelerator() builds from that environment
            accelerator_view = types.SimpleNamespace(
                multi_device=False, num_processes=exp["world"], is_fsdp2=False,
                distributed_type=DistributedType.DEEPSPEED, is_main_process=True)
            parallelism._validate_accelerator(accelerator_view)
            expect_equal("sp_size", parallelism.sp_size, exp["sp"])
            expect_equal("sp_backend", parallelism.sp_backend, "deepspeed")
            expect_equal("data_parallel_size", parallelism.data_parallel_size, exp["dp"])
            expect_equal("total_size", parallelism.total_size, exp["world"])
            if exp["sp"] > 1:
                handler = parallelism.sp_handler
                expect_equal("sp_seq_length_is_variable", handler.sp_seq_length_is_variable, True)
                expect_equal("sp_attn_implementation", handler.sp_attn_implementation, "sdpa")

            plugin = DeepSpeedPlugin()  # reads ACCELERATE_DEEPSPEED_CONFIG_FILE
            plugin.set_mixed_precision(os.environ["ACCELERATE_MIXED_PRECISION"])
            ds = copy.deepcopy(plugin.deepspeed_config)
            expect_equal("plugin bf16.enabled", bool(ds["bf16"]["enabled"]), exp["bf16"])
            expect_equal("plugin zero_stage", plugin.zero_stage, exp["zero_stage"])

    ds_config = DeepSpeedConfig(ds, mpu=ulysses_mpu(exp["sp"]))
    expect_batch(ds_config, exp, "Accelerate DeepSpeedPlugin config")
    expect_zero(ds_config, exp, "Accelerate DeepSpeedPlugin config")
    return (f"ClusterConfig + accelerate launch env -> ParallelismConfig(dp_shard="
            f"{parallelism.dp_shard_size}, sp={parallelism.sp_size},"
            f" total={parallelism.total_size})"
            f", DeepSpeedPlugin(zero={plugin.zero_stage}, "
            f"mixed_precision={env['ACCELERATE_MIXED_PRECISION']}) -> DeepSpeedConfig "
            f"train_batch_size={ds_config.train_batch_size}")


CHECKS = [("ds_config.json", check_deepspeed), ("arctic_training.yaml", check_arctic),
          ("accelerate_config.yaml", check_accelerate)]

SKIPPED = [
    "training itself (deepspeed.initialize on a model, ArcticTraining's Trainer, "
    "Accelerator.prepare): needs a GPU (NCCL, FusedAdam), the model weights, a tokenizer and "
    "the dataset; each file is checked by its consumer's config code on CPU instead",
    "collectives: the world is a fake process group of the target size (this process is rank 0), "
    "so process groups and device meshes are built but nothing is communicated",
    "arctic_training.yaml data.sources: a placeholder for the user's HF dataset; validated as a "
    "config entry, not loaded (no network)",
    "arctic_training.yaml model placeholder: replaced by a local stand-in config dir of the run's "
    "family (transformers' own config class) so that TrainerConfig's AutoConfig lookups run "
    "offline (cases without model.load)",
    "ArcticTraining optimizer objects (FusedAdam needs CUDA, DeepSpeedCPUAdam compiles a C++ op): "
    "the optimizer type is validated against the trainer's registry, not constructed",
]


def main(argv):
    if len(argv) < 2:
        print(__doc__.split("\n\n")[1], file=RESULTS)
        return 2
    failures = 0
    for case in (Path(p).resolve() for p in argv[1:]):
        try:
            exp = json.loads((case / "expect.json").read_text())
        except Exception as error:  # noqa: BLE001 - reported as a failed case
            print(f"FAIL {case}/expect.json: {error}", file=RESULTS)
            failures += 1
            continue
        for name, check in CHECKS:
            try:
                summary = check(case, exp)
                print(f"OK   {case / name}: {summary}", file=RESULTS)
            except Exception as error:  # noqa: BLE001 - a consumer's rejection is a result
                failures += 1
                reason = " ".join(f"{type(error).__name__}: {error}".split())
                print(f"FAIL {case / name}: {reason}", file=RESULTS)
                traceback.print_exc()
    for line in SKIPPED:
        print(f"SKIPPED {line}", file=RESULTS)
    print(f"{'FAILED' if failures else 'PASSED'}: {failures} file(s) rejected", file=RESULTS)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
