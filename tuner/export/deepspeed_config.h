// A run config as a DeepSpeed JSON config (ds_config.json, DeepSpeed >= 0.18.2 for ALST/Ulysses):
// batch arithmetic, Ulysses SP degree, ZeRO stage and optimizer offload, bf16 with fp32 gradient
// accumulation, clipping, AdamW and the learning-rate schedule.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/options.h"

namespace ulysses::exports {

// A DeepSpeed config and what it cannot say.
struct DeepSpeedExport {
  nlohmann::json config;              // the ds_config.json document
  std::vector<std::string> warnings;  // one line each, "<run config key(s)>: <what>"
};

// The DeepSpeed config of `run`. With mb = sequence.micro_batch, gas = sequence.grad_accum and
// dp = world / sp (world = mesh.dp * mesh.sp):
//   train_micro_batch_size_per_gpu = mb, gradient_accumulation_steps = gas,
//   train_batch_size = mb * gas * dp (DeepSpeed divides the world by the SP degree),
//   sequence_parallel_size = sp, data_parallel_size = dp (with both keys deepspeed.initialize
//     builds a (data_parallel, sequence_parallel) device mesh: SP groups of contiguous ranks),
//   zero_optimization = {stage: zero_stage(run)} (zero.stage as run) plus
//     offload_optimizer = {device: cpu, pin_memory: true} when deepspeed_offloads_optimizer(run)
//     (memory.offload_optimizer at stage >= 1), and at stages 1-3 the buckets of zero.bucket_mb
//     (ulysses-train's bytes per collective) in DeepSpeed's elements: reduce_bucket_size =
//     bytes / 4 (gradients are reduced in fp32), and allgather_bucket_size (stages 1-2) or
//     stage3_prefetch_bucket_size (stage 3) = bytes / the weights' element size,
//   bf16 = {enabled: memory.precision == bf16},
//   for bf16, as ulysses-train accumulates and reduces gradients in fp32:
//     data_types = {grad_accum_dtype: fp32} at stages 1-3 (DeepSpeed 0.19: BF16_Optimizer at
//     stage 1 without offload, the ZeRO optimizers' fp32 accumulation buffers otherwise; stage 0
//     refuses it), communication_data_type = "fp32",
//   seq_parallel_communication_data_type = "bf16" when bf16, else "fp32",
//   gradient_clipping = optim.grad_clip (0 = off, as in DeepSpeed),
//   optimizer = {type: AdamW, params: {lr, betas, eps, weight_decay}} from optim,
//   scheduler (type, params), linear warmup (warmup_type: linear) from 0 over optim.warmup_steps:
//     constant: none when warmup_steps == 0, else WarmupLR up to lr;
//     linear:   WarmupDecayLR {warmup_min_lr: min_lr, warmup_max_lr: lr, total_num_steps:
//               train.steps} (decays to min_lr at train.steps);
//     cosine:   WarmupCosineLR {warmup_min_ratio: 0, cos_min_ratio: min_lr / lr,
//               total_num_steps: train.steps}.
//   DeepSpeed's schedulers, like HF's, use 0-based iterations: each step runs at the rate that
//   ulysses-train uses one step earlier (the first warmup step at 0). Not warned about.
// Throws UserError(unsupported_mesh(run, "DeepSpeed")) for ring attention or an uneven head split
// (export_common.h): DeepSpeed's Ulysses runs neither.
// Warnings, in this order (each present only when it applies):
//   ulysses_torch_version_warning(run) (1 < sp < world);
//   alst_switches_warning(run, "DeepSpeed JSON") (tiled MLP/loss, activation offload,
//     checkpointing);
//   deepspeed_zero_warnings(run) (stage 0: no optimizer offload, bf16 gradient accumulation);
//   "optim.warmup_steps: ..." when a Warmup* scheduler is written with warmup_steps < 2
//     (DeepSpeed warms up over max(2, warmup_num_steps) steps, warmup_num_steps >= 1);
//   "optim.min_lr: ..." for linear with min_lr > 0 (WarmupDecayLR warms up from min_lr, not 0);
//   "optim.schedule: ..." for a schedule DeepSpeed has no scheduler for (block omitted).
// REQUIRES: `run` passed config::validate.
DeepSpeedExport deepspeed_config(const config::RunConfig& run);

}  // namespace ulysses::exports
