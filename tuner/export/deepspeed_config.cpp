// RunConfig -> DeepSpeed JSON; the key names are DeepSpeed's (deepspeed/runtime/config.py,
// zero/config.py, lr_schedules.py). See deepspeed_config.h for every value and warning.
#include "tuner/export/deepspeed_config.h"

#include <algorithm>
#include <cstdint>

#include "tuner/export/export_common.h"

namespace ulysses::exports {
namespace {

using nlohmann::json;

// DeepSpeed's Warmup* schedulers take warmup_num_steps >= 1 and warm up over max(2, it) steps.
constexpr int64_t kDeepSpeedMinWarmupSteps = 2;

// The `scheduler` block for optim (a null json when none is needed), appending warnings.
json scheduler_block(const config::RunConfig& run, std::vector<std::string>& warnings) {
  const config::OptimOptions& optim = run.optim;
  const int64_t warmup = optim.warmup_steps;
  const int64_t warmup_num_steps = std::max<int64_t>(warmup, 1);
  json block;
  if (optim.schedule == "constant") {
    if (warmup == 0) return json();  // the optimizer's lr is already constant
    block = {{"type", "WarmupLR"},
             {"params",
              {{"warmup_min_lr", 0.0},
               {"warmup_max_lr", optim.lr},
               {"warmup_num_steps", warmup_num_steps},
               {"warmup_type", "linear"}}}};
  } else if (optim.schedule == "linear") {
    block = {{"type", "WarmupDecayLR"},
             {"params",
              {{"total_num_steps", run.train.steps},
               {"warmup_min_lr", optim.min_lr},
               {"warmup_max_lr", optim.lr},
               {"warmup_num_steps", warmup_num_steps},
               {"warmup_type", "linear"}}}};
  } else if (optim.schedule == "cosine") {
    const double cos_min_ratio = optim.lr > 0.0 ? optim.min_lr / optim.lr : 0.0;
    block = {{"type", "WarmupCosineLR"},
             {"params",
              {{"total_num_steps", run.train.steps},
               {"warmup_min_ratio", 0.0},
               {"cos_min_ratio", cos_min_ratio},
               {"warmup_num_steps", warmup_num_steps},
               {"warmup_type", "linear"}}}};
  } else {
    warnings.push_back("optim.schedule: DeepSpeed has no scheduler for '" + optim.schedule +
                       "'; the scheduler block is omitted");
    return json();
  }
  if (warmup < kDeepSpeedMinWarmupSteps) {
    warnings.push_back("optim.warmup_steps: " + std::to_string(warmup) + " becomes " +
                       std::to_string(kDeepSpeedMinWarmupSteps) +
                       " warmup steps in DeepSpeed's " + block["type"].get<std::string>() +
                       " (it warms up over at least 2 steps)");
  }
  if (optim.schedule == "linear" && optim.min_lr > 0.0) {
    warnings.push_back(
        "optim.min_lr: DeepSpeed's WarmupDecayLR warms up from warmup_min_lr = min_lr and decays"
        " to it; ulysses-train warms up from 0");
  }
  return block;
}

}  // namespace

DeepSpeedExport deepspeed_config(const config::RunConfig& run) {
  const MeshSizes mesh = mesh_sizes(run);
  // bf16-states: bf16 weights, gradients and AdamW moments, no masters (zero.stage 0 only).
  const bool bf16_states = run.memory.precision == "bf16-states";
  const bool bf16 = run.memory.precision == "bf16" || bf16_states;
  DeepSpeedExport out;

  refuse_unsupported_mesh(run, "DeepSpeed");
  if (auto warning = ulysses_torch_version_warning(run)) out.warnings.push_back(*warning);
  if (auto warning = alst_switches_warning(run, "DeepSpeed JSON")) out.warnings.push_back(*warning);
  for (const std::string& warning : deepspeed_zero_warnings(run)) out.warnings.push_back(warning);
  if (bf16_states) {
    out.warnings.push_back(
        "memory.precision=bf16-states: DeepSpeed's bf16 keeps fp32 master weights and fp32 AdamW"
        " moments (its bf16 optimizer wrapper, at every ZeRO stage) where this run keeps bf16"
        " moments and no masters: 10 bytes per parameter more; no DeepSpeed setting keeps"
        " transformers' bf16 optimizer states");
  }

  json zero = {{"stage", zero_stage(run)}};
  if (deepspeed_offloads_optimizer(run)) {
    zero["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  }
  if (zero_stage(run) >= 1) {
    // zero.bucket_mb is the bytes of one collective in ulysses-train: gradients reduced in fp32,
    // weights gathered in their own dtype. DeepSpeed counts its buckets in elements.
    const auto bucket_bytes = static_cast<int64_t>(run.zero.bucket_mb * 1024.0 * 1024.0);
    const int64_t weight_bytes = bf16 ? 2 : 4;
    zero["reduce_bucket_size"] = std::max<int64_t>(bucket_bytes / 4, 1);
    if (zero_stage(run) == 3) {
      zero["stage3_prefetch_bucket_size"] = std::max<int64_t>(bucket_bytes / weight_bytes, 1);
    } else {
      zero["allgather_bucket_size"] = std::max<int64_t>(bucket_bytes / weight_bytes, 1);
    }
  }

  const int64_t micro_batch = run.sequence.micro_batch;
  const int64_t grad_accum = run.sequence.grad_accum;
  json& config = out.config;
  config["train_micro_batch_size_per_gpu"] = micro_batch;
  config["gradient_accumulation_steps"] = grad_accum;
  config["train_batch_size"] = micro_batch * grad_accum * mesh.dp;
  config["sequence_parallel_size"] = mesh.sp;
  config["data_parallel_size"] = mesh.dp;
  config["zero_optimization"] = zero;
  config["bf16"] = {{"enabled", bf16}};
  if (bf16_states) {
    config["communication_data_type"] = "bf16";  // the run all-reduces its bf16 gradients
  } else if (bf16) {
    // ulysses-train accumulates and reduces gradients in fp32 whatever the weights' dtype.
    // DeepSpeed keeps bf16 gradients in bf16 unless told (engine.get_data_types); at stage 0 it
    // refuses fp32 accumulation of bf16 weights (deepspeed_zero_warnings).
    if (zero_stage(run) >= 1) config["data_types"] = {{"grad_accum_dtype", "fp32"}};
    config["communication_data_type"] = "fp32";
  }
  config["seq_parallel_communication_data_type"] = bf16 ? "bf16" : "fp32";
  config["gradient_clipping"] = run.optim.grad_clip;
  config["optimizer"] = {{"type", "AdamW"},
                         {"params",
                          {{"lr", run.optim.lr},
                           {"betas", {run.optim.betas[0], run.optim.betas[1]}},
                           {"eps", run.optim.eps},
                           {"weight_decay", run.optim.weight_decay}}}};
  json scheduler = scheduler_block(run, out.warnings);
  if (!scheduler.is_null()) config["scheduler"] = scheduler;
  return out;
}

}  // namespace ulysses::exports
