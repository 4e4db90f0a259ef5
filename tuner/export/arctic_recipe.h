// A run config as an ArcticTraining recipe (arctic-training 0.8, `arctic_training RECIPE.yaml`):
// the ALST switches DeepSpeed JSON cannot express (tiled MLP, activation checkpoint CPU offload)
// with the SP degree, batch, model, data, optimizer, scheduler and DeepSpeed ZeRO keys of
// arctic_training.config.trainer.TrainerConfig.
#pragma once
#include <string>
#include <vector>

#include "config/options.h"

namespace ulysses::exports {

// Values the user must replace before training (the recipe says so in a comment beside each).
inline constexpr char kArcticModelPlaceholder[] = "REPLACE_WITH_HF_MODEL_NAME_OR_PATH";
inline constexpr char kArcticDataPlaceholder[] = "REPLACE_WITH_HF_TEXT_DATASET";

// An ArcticTraining recipe and what it cannot say.
struct ArcticRecipeExport {
  std::string yaml;                   // the recipe, a YAML document with comments
  std::vector<std::string> warnings;  // one line each, "<run config key(s)>: <what>"
};

// The recipe of `run` (keys as TrainerConfig and its sub-configs name them):
//   type: causal (next-token loss on every token of packed text, as ulysses-train trains;
//     `sft` would mask prompts), micro_batch_size = sequence.micro_batch,
//   gradient_accumulation_steps = sequence.grad_accum, sequence_parallel_size = mesh.sp,
//   tiled_mlp_compute = (memory.tiled_mlp != 1), activation_checkpoint_cpu_offload =
//   memory.offload_activations, train_iters = train.steps, seed = train.seed;
//   model: name_or_path = model.load, or kArcticModelPlaceholder when load is empty, with a
//     comment (and the recipe's header comment) naming the family it must be
//     (model_family_text; ArcticTraining reads the family from the checkpoint's config.json; its
//     model `type` is the model factory, left at its default);
//     dtype = memory.precision (bf16|fp32); attn_implementation = sdpa;
//     disable_activation_checkpoint = !(memory.checkpointing || memory.offload_activations)
//     (offloading activations offloads the checkpoints, so it implies checkpointing);
//   data: sources = [kArcticDataPlaceholder], max_length = sequence.length, seed = data.seed;
//   optimizer: type = cpu_adam when deepspeed_offloads_optimizer(run) (DeepSpeed requires its
//     CPU Adam for offload) else fused_adam, learning_rate, betas, weight_decay from optim;
//   scheduler (transformers.get_scheduler names): constant (warmup_steps 0) |
//     constant_with_warmup | linear | cosine (min_lr 0) | cosine_with_min_lr
//     {scheduler_specific_kwargs: {min_lr}}, warmup_ratio such that ArcticTraining's
//     int(warmup_ratio * train_iters) equals optim.warmup_steps (1.0 when warmup_steps >= steps);
//   deepspeed: zero_optimization, and for bf16 data_types and communication_data_type, exactly
//     as deepspeed_config(run) writes them, gradient_clipping,
//     seq_parallel_communication_data_type. ArcticTraining fills in the batch keys and bf16 itself
//     (train_batch_size = micro_batch_size * gas * WORLD_SIZE / sequence_parallel_size).
// Throws UserError(unsupported_mesh(run, ...)) for ring attention or an uneven head split
// (export_common.h).
// Warnings, in this order (each only when it applies):
//   ulysses_torch_version_warning(run);
//   deepspeed_zero_warnings(run);
//   "model.load: ..." when the model is the placeholder (naming the family it must be);
//   "data.source: ..." always (ulysses-train's sources have no ArcticTraining data source);
//   "memory.tiled_mlp=N: ..." for a fixed N > 1 (ArcticTraining's tile count is automatic);
//   "memory.tiled_loss=...: ..." when tiled_loss != 1 and sp == 1 (ArcticTraining tiles
//     logits+loss only when sequence_parallel_size > 1) or tiled_loss is a fixed N > 1;
//   "optim.eps: ..." when eps != 1e-8 (ArcticTraining's Adam factories keep DeepSpeed's 1e-8);
//   "optim.weight_decay: ..." when > 0 (ArcticTraining exempts norm weights from decay);
//   "optim.min_lr: ..." for linear with min_lr > 0 (HF's linear schedule decays to 0);
//   "optim.warmup_steps: ..." when warmup_steps > train.steps (warmup_ratio is capped at 1).
// REQUIRES: `run` passed config::validate.
ArcticRecipeExport arctic_recipe(const config::RunConfig& run);

}  // namespace ulysses::exports
