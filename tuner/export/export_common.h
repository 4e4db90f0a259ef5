// What every export format (DeepSpeed JSON, ArcticTraining recipe, Accelerate config) derives the
// same way from a run config: the mesh sizes, the ZeRO stage, and the warnings that hold for any
// consumer that runs DeepSpeed's Ulysses.
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

// The DeepSpeed ZeRO stage of the export, 0-3: zero.stage as the run ran it, never changed.
// (DeepSpeed offloads optimizer state only inside a ZeRO optimizer, "offload_optimizer: valid for
// ZeRO stage 1, 2, 3", deepspeed/runtime/zero/config.py: at stage 0 the export does not offload
// and deepspeed_zero_warnings says so.)
int zero_stage(const config::RunConfig& run);

// True when the export offloads the optimizer to the CPU: memory.offload_optimizer at a ZeRO
// stage >= 1.
bool deepspeed_offloads_optimizer(const config::RunConfig& run);

// What DeepSpeed (0.19) cannot do as the run did at its ZeRO stage, one line each, in this order:
//   "memory.offload_optimizer=true, zero.stage=0: ..." (no optimizer offload without ZeRO; the
//     export keeps stage 0 and does not offload);
//   "memory.precision=bf16, zero.stage=0: ..." (without ZeRO DeepSpeed accumulates bf16
//     gradients in bf16 and refuses data_types.grad_accum_dtype fp32; ulysses-train accumulates
//     in fp32). At stages 1-3 the export keeps fp32 accumulation (grad_accum_dtype fp32), so
//     nothing is said.
std::vector<std::string> deepspeed_zero_warnings(const config::RunConfig& run);

// The run's decoder family as the consumers know it, for the exports' comments and warnings:
// "qwen3 (transformers Qwen3ForCausalLM, config.json model_type qwen3)" (config/model_family.h).
// REQUIRES: run.model.family is a supported family (a validated RunConfig).
std::string model_family_text(const config::RunConfig& run);

// The HF/transformers attention implementation for attention.backend: always "sdpa" (every
// ulysses-train backend is a PyTorch SDPA kernel or the math fallback; none is flash_attn's).
std::string hf_attention_implementation(const config::RunConfig& run);

// When 1 < sp < world: one line saying that DeepSpeed's Ulysses needs PyTorch >= 2.3 (older
// versions route gradients to the wrong ranks in the backward of all_gather over an SP group
// that is not the whole world) or else a weighted all-reduce of the loss. nullopt when sp == 1
// (no Ulysses) or sp == world (the SP group is the world). Starts with "mesh: ".
std::optional<std::string> ulysses_torch_version_warning(const config::RunConfig& run);

// What DeepSpeed's Ulysses (and `what` over it: ArcticTraining, Accelerate, the deepspeed trial
// backend) cannot run of the run's mesh, as one line; nullopt when it can run it. Ulysses has the
// even all-to-all of the heads alone, so:
//   ring attention (mesh.sp_ring resolves to more than 1): "mesh.sp_ring: 2 (ring attention over
//     sp 4 = 2 all-to-all x 2 ring) runs only in ulysses-train; <what> has Ulysses' all-to-all
//     alone: export a configuration with sp_ring 1";
//   an sp that does not split the heads evenly (config::heads_split_evenly; mesh.uneven_heads):
//     "mesh.uneven_heads: sp 2 splits 3 query heads / 1 KV head unevenly, which runs only in
//     ulysses-train; <what> needs sp to divide the query heads ...: export a configuration with
//     such an sp".
// The exports refuse what this names (refuse_unsupported_mesh), and a sweep calls a point of the
// deepspeed backend with such a mesh `invalid` with this line, so the two cannot differ.
std::optional<std::string> unsupported_mesh(const config::RunConfig& run, const std::string& what);

// Throws UserError(unsupported_mesh(run, what)) when there is such a line.
void refuse_unsupported_mesh(const config::RunConfig& run, const std::string& what);

// The PyTorch version that `$ULYSSES_PYTHON` (else `python3` on PATH) imports here, e.g.
// "2.13.0+cpu", or nullopt when none answers within 20 s.
std::optional<std::string> local_torch_version();

// `warnings` settled against the PyTorch found here (local_torch_version): without
// ulysses_torch_version_warning(run) when `torch_version` is 2.3 or newer; with it followed by
// " (found PyTorch <version>)" when older; unchanged when the version is unknown or unreadable.
std::vector<std::string> settle_torch_version_warning(
    std::vector<std::string> warnings, const config::RunConfig& run,
    const std::optional<std::string>& torch_version);

// The run's memory switches that DeepSpeed JSON and an Accelerate config have no key for, as
// "key=value" in this order: memory.tiled_mlp (!= 1), memory.tiled_loss (!= 1),
// memory.offload_activations (true), memory.checkpointing (true). Empty when none is set.
std::vector<std::string> alst_only_switches(const config::RunConfig& run);

// When alst_only_switches is not empty: one line "<the switches>: <format> cannot express these
// ALST switches; use the ArcticTraining recipe (arctic_training.yaml: ...)". nullopt otherwise.
std::optional<std::string> alst_switches_warning(const config::RunConfig& run,
                                                 const std::string& format);

}  // namespace ulysses::exports
