// Checkpoints (SPEC 5.7): <dir>/step-<N>/ holds model.safetensors with HF Llama names, config.json
// (HF LlamaConfig), optimizer.safetensors (AdamW moments) and trainer_state.json (step, seeds,
// data position), so that resume continues bit-for-bit. A checkpoint is written under a temporary
// name and renamed, so a crash never leaves a half checkpoint that looks whole.
#pragma once
#include <string>

#include "config/options.h"
#include "model/llama.h"
#include "train/adamw.h"

namespace ulysses::train {

struct TrainerState {
  int64_t step = 0;            // last completed step
  int64_t samples_seen = 0;    // global samples consumed (data position)
  uint64_t data_seed = 0;
  uint64_t train_seed = 0;
};

// Writes a complete checkpoint to `final_dir` (e.g. ".../step-20" or ".../initial"). Only one
// rank calls it. `optimizer` may be null (initial weights). Throws UserError when the directory
// cannot be written. On success `final_dir` exists and is complete; an older checkpoint of the
// same name is replaced.
void save_checkpoint(const std::string& final_dir, model::LlamaForCausalLM& model,
                     const config::ModelOptions& model_options, const AdamW* optimizer,
                     const TrainerState& state);

// Loads weights, optimizer state (when `optimizer` is non-null) and trainer state from `dir`.
// Throws UserError naming the file when something is missing or does not match the model.
TrainerState load_checkpoint(const std::string& dir, model::LlamaForCausalLM& model,
                             AdamW* optimizer);

// Resolves checkpoint.resume: "latest" -> the highest <checkpoint_dir>/step-<N>, a path -> itself.
// Returns "" when resume is "" (or "latest" with none written yet).
std::string resolve_resume_dir(const config::CheckpointOptions& options);

}  // namespace ulysses::train
