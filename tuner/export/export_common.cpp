// Mesh sizes, ZeRO stage and the shared warnings of every export format; see export_common.h.
#include "tuner/export/export_common.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace ulysses::exports {
namespace {

// zero.stage when the config type has a `zero` section, else 0. A template so that the check
// compiles both before and after RunConfig gains the section (SPEC 2 documents `zero.stage`).
template <typename Config>
int configured_zero_stage(const Config& run) {
  if constexpr (requires { run.zero.stage; }) {
    return static_cast<int>(run.zero.stage);
  } else {
    return 0;
  }
}

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
  const int stage = configured_zero_stage(run);
  TORCH_CHECK(stage >= 0 && stage <= 3, "zero_stage: zero.stage must be validated, got ", stage);
  return run.memory.offload_optimizer ? std::max(stage, 1) : stage;
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
