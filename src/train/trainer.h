// The training loop of ulysses-train: mesh, model, data, exact gradients, AdamW, metrics,
// checkpoints and evaluation for one rank.
#pragma once
#include <memory>

#include "comm/dist_env.h"
#include "comm/mesh.h"
#include "config/options.h"
#include "model/llama.h"

namespace ulysses::train {

// The device a run uses: cpu, or cuda:<LOCAL_RANK>. Throws UserError when CUDA is asked for but
// this build or machine has none.
at::Device select_device(const config::RunConfig& config, const comm::DistEnv& env);

// Builds the model for this rank: seeded init (identical on every rank) or HF weights from
// model.load, moved to `device`, with Ulysses attention over mesh.sp() when sp > 1 and local
// attention otherwise.
model::LlamaForCausalLM build_model(const config::RunConfig& config, comm::DeviceMesh& mesh,
                                    const at::Device& device);

// Runs config.train.steps steps (from a resumed checkpoint when checkpoint.resume is set) and
// evaluation when configured. Rank 0 writes metrics.jsonl / summary.json under output.dir and
// prints one progress line per step. Returns the process exit status. Throws UserError on bad
// input discovered at run time, comm::CommError when a peer fails.
// REQUIRES: config validated for mesh.world().size().
int run_training(const config::RunConfig& config, comm::DeviceMesh& mesh, const at::Device& device);

}  // namespace ulysses::train
