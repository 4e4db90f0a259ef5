// What every export format (DeepSpeed JSON, ArcticTraining recipe, Accelerate config) derives the
// same way from a run config: the mesh sizes, the ZeRO stage, and the warnings that hold for any
// consumer that runs DeepSpeed's Ulysses (SPEC 7, "Recommend / export").
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/options.h"

namespace ulysses::exports {

// The mesh of a run: world = dp * sp ranks, SP groups contiguous (as DeepSpeed's Ulysses groups).
struct MeshSizes {
  int64_t world = 1;
  int64_t dp = 1;  // data-parallel degree = world / sp
  int64_t sp = 1;  // sequence-parallel degree
};

// REQUIRES: run.mesh.dp >= 1 and run.mesh.sp >= 1 (a validated RunConfig).
MeshSizes mesh_sizes(const config::RunConfig& run);

// The DeepSpeed ZeRO stage of the export, 0-3: `zero.stage` when RunConfig has a `zero` section
// (SPEC 2 documents one; options.h has none yet, so today this is 0), raised to 1 when
// memory.offload_optimizer is on, because DeepSpeed offloads optimizer state only inside a ZeRO
// optimizer ("offload_optimizer: valid for ZeRO stage 1, 2, 3", deepspeed/runtime/zero/config.py;
// at stage 0 there is none and the offload would be silently ignored). Stage 1 is the least
// change: ZeRO-1 partitions the optimizer states over all dp*sp ranks and keeps the math of
// AdamW unchanged.
int zero_stage(const config::RunConfig& run);

// The HF/transformers attention implementation for attention.backend: always "sdpa" (every
// ulysses-train backend is a PyTorch SDPA kernel or the math fallback; none is flash_attn's).
std::string hf_attention_implementation(const config::RunConfig& run);

// When 1 < sp < world: one line saying that DeepSpeed's Ulysses needs PyTorch >= 2.3 (older
// versions route gradients to the wrong ranks in the backward of all_gather over an SP group
// that is not the whole world) or else a weighted all-reduce of the loss. nullopt when sp == 1
// (no Ulysses) or sp == world (the SP group is the world). Starts with "mesh: ".
std::optional<std::string> ulysses_torch_version_warning(const config::RunConfig& run);

// The run's memory switches that DeepSpeed JSON and an Accelerate config have no key for, as
// "key=value" in this order: memory.tiled_mlp (!= 1), memory.tiled_loss (!= 1),
// memory.offload_activations (true), memory.checkpointing (true). Empty when none is set.
std::vector<std::string> alst_only_switches(const config::RunConfig& run);

// When alst_only_switches is not empty: one line "<the switches>: <format> cannot express these
// ALST switches; use the ArcticTraining recipe (arctic_training.yaml: ...)". nullopt otherwise.
std::optional<std::string> alst_switches_warning(const config::RunConfig& run,
                                                 const std::string& format);

}  // namespace ulysses::exports
