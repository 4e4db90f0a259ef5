// The training loop of ulysses-train: mesh, model, data, exact gradients, AdamW, metrics,
// checkpoints and evaluation for one rank.
#pragma once
#include <memory>

#include "comm/dist_env.h"
#include "comm/mesh.h"
#include "config/options.h"
#include "model/llama.h"
#include "zero/zero_partition.h"

namespace ulysses::train {

// The device a run uses: cpu, or cuda:<LOCAL_RANK>. Throws UserError when CUDA is asked for but
// this build or machine has none.
at::Device select_device(const config::RunConfig& config, const comm::DistEnv& env);

// Builds the model for this rank: seeded init (identical on every rank) or HF weights from
// model.load, moved to `device`, with Ulysses attention over mesh.sp() when sp > 1 and local
// attention otherwise. Every rank of the world calls it (memory.tiled_mlp auto is a MAX over
// ranks). `mlp_tiles`, when given, receives the resolved MLP tile count (1 = plain MLP).
// `shapes_only` (ZeRO-3): the weights are placeholders that take no memory
// (WeightInit::kShapesOnly); hand the model to a sharded-build ZeroPartition with
// shard_source() before anything else touches it.
model::LlamaForCausalLM build_model(const config::RunConfig& config, comm::DeviceMesh& mesh,
                                    const at::Device& device, int64_t* mlp_tiles = nullptr,
                                    bool shapes_only = false);

// Where a ZeRO-3 rank's shards get their values in the sharded build: model.load's weight files
// (only the bytes of the rank's shards are read) or the seeded init drawn by range
// (model::init_weight_range), the values build_model gives the whole model either way.
// Throws UserError as load_hf_weights does for bad weight files.
ZeroPartition::ShardFill shard_source(const config::ModelOptions& options,
                                      model::LlamaForCausalLM& model);

// Runs config.train.steps steps (from a resumed checkpoint when checkpoint.resume is set) and
// evaluation when configured. Rank 0 echoes the effective config, writes run.yaml (loads back as
// this run config), metrics.jsonl and summary.json under output.dir, prints one progress line per
// step, one per checkpoint saved and where the outputs are at the end.
// Resume: continues the data stream at the checkpoint's samples_seen (another mesh or batch size
// neither replays nor skips samples; rank 0 says so), keeps the metrics.jsonl records of the steps
// before the checkpoint, and returns kExitOk without touching the outputs when the checkpoint is
// already at train.steps. A step whose grad_norm is not finite skips the update (counted in
// metrics); optim.max_consecutive_skips of them in a row throw std::runtime_error (diverged).
// Returns the process exit status. Throws UserError on bad input discovered at run time (e.g. a
// checkpoint without optimizer state), comm::CommError when a peer fails.
// REQUIRES: config validated for mesh.world().size().
int run_training(const config::RunConfig& config, comm::DeviceMesh& mesh, const at::Device& device);

}  // namespace ulysses::train
