// Mesh sizes, ZeRO stage and the shared warnings of every export format; see export_common.h.
#include "tuner/export/export_common.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace ulysses::exports {
namespace {

std::string tile_text(const config::TileCount& tiles) {
  return tiles.is_auto() ? "auto" : std::to_string(tiles.value);
}

}  // namespace

MeshSizes mesh_sizes(const config::RunConfig& run) {
  TORCH_CHECK(run.mesh.dp >= 1 && run.mesh.sp >= 1, "mesh_sizes: mesh must be validated, got dp=",
              run.mesh.dp, " sp=", run.mesh.sp);
  return MeshSizes{run.mesh.dp * run.mesh.sp, run.mesh.dp, run.mesh.sp};
}

int zero_stage(const config::RunConfig& run) {
  const int stage = static_cast<int>(run.zero.stage);
  TORCH_CHECK(stage >= 0 && stage <= 3, "zero_stage: zero.stage must be validated, got ", stage);
  return stage;
}

bool deepspeed_offloads_optimizer(const config::RunConfig& run) {
  return run.memory.offload_optimizer && zero_stage(run) >= 1;
}

std::vector<std::string> deepspeed_zero_warnings(const config::RunConfig& run) {
  std::vector<std::string> warnings;
  if (zero_stage(run) != 0) return warnings;
  const std::string stage1 = mesh_sizes(run).world == 1
                                 ? " (in a world of 1 stage 1 shards nothing)"
                                 : " (stage 1 also shards the optimizer state over the ranks)";
  if (run.memory.offload_optimizer) {
    warnings.push_back(
        "memory.offload_optimizer=true, zero.stage=0: DeepSpeed offloads optimizer state only"
        " inside ZeRO, so this export keeps stage 0 and does not offload; to offload as the"
        " trial did, set zero_optimization.stage 1 with offload_optimizer {device: cpu,"
        " pin_memory: true}" + stage1);
  }
  if (run.memory.precision == "bf16") {
    warnings.push_back(
        "memory.precision=bf16, zero.stage=0: without ZeRO DeepSpeed accumulates bf16 gradients"
        " in bf16 (it refuses data_types.grad_accum_dtype fp32 at stage 0) where ulysses-train"
        " accumulates them in fp32; zero_optimization.stage 1 with data_types.grad_accum_dtype"
        " fp32 accumulates in fp32" + stage1);
  }
  return warnings;
}

std::string hf_attention_implementation(const config::RunConfig& /*run*/) { return "sdpa"; }

std::optional<std::string> ulysses_torch_version_warning(const config::RunConfig& run) {
  const MeshSizes mesh = mesh_sizes(run);
  if (mesh.sp <= 1 || mesh.sp >= mesh.world) return std::nullopt;
  return "mesh: sp=" + std::to_string(mesh.sp) + " < world=" + std::to_string(mesh.world) +
         ": DeepSpeed's Ulysses needs PyTorch >= 2.3 (older versions route gradients to the wrong"
         " ranks in the all_gather backward when the SP group is not the whole world), or else"
         " reduce the loss with a weighted all-reduce over the SP group (sum of token losses and"
         " token count, then divide) instead of all_gather";
}

std::vector<std::string> alst_only_switches(const config::RunConfig& run) {
  std::vector<std::string> switches;
  if (run.memory.tiled_mlp.value != 1) {
    switches.push_back("memory.tiled_mlp=" + tile_text(run.memory.tiled_mlp));
  }
  if (run.memory.tiled_loss.value != 1) {
    switches.push_back("memory.tiled_loss=" + tile_text(run.memory.tiled_loss));
  }
  if (run.memory.offload_activations) switches.push_back("memory.offload_activations=true");
  if (run.memory.checkpointing) switches.push_back("memory.checkpointing=true");
  return switches;
}

std::optional<std::string> alst_switches_warning(const config::RunConfig& run,
                                                 const std::string& format) {
  const std::vector<std::string> switches = alst_only_switches(run);
  if (switches.empty()) return std::nullopt;
  std::string names;
  for (const std::string& name : switches) names += (names.empty() ? "" : ", ") + name;
  return names + ": " + format +
         " cannot express these ALST switches; use the ArcticTraining recipe"
         " (arctic_training.yaml: tiled_mlp_compute, activation_checkpoint_cpu_offload,"
         " model.disable_activation_checkpoint; it tiles logits+loss itself when"
         " sequence_parallel_size > 1)";
}

}  // namespace ulysses::exports
