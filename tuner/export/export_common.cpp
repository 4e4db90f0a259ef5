// Mesh sizes, ZeRO stage and the shared warnings of every export format; see export_common.h.
#include "tuner/export/export_common.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <regex>

#include "common/error.h"
#include "common/shell_quote.h"
#include "config/mesh_factors.h"
#include "config/model_family.h"

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

std::string model_family_text(const config::RunConfig& run) {
  const config::ModelFamily family = config::model_family(run.model.family);
  return std::string(family.name) + " (transformers " + family.hf_architecture +
         ", config.json model_type " + family.name + ")";
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

std::optional<std::string> unsupported_mesh(const config::RunConfig& run, const std::string& what) {
  const int64_t sp = run.mesh.sp, hq = run.model.num_heads, hkv = run.model.num_kv_heads;
  const int64_t ring = config::resolved_sp_ring(run.mesh, hq, hkv);
  if (ring > 1) {
    return "mesh.sp_ring: " + std::to_string(ring) + " (ring attention over sp " +
           std::to_string(sp) + " = " + std::to_string(sp / ring) + " all-to-all x " +
           std::to_string(ring) + " ring) runs only in ulysses-train; " + what +
           " has Ulysses' all-to-all alone: export a configuration with sp_ring 1";
  }
  if (sp <= 1 || config::heads_split_evenly(hq, hkv, sp)) return std::nullopt;
  return "mesh.uneven_heads: sp " + std::to_string(sp) + " splits " + std::to_string(hq) +
         " query heads / " + std::to_string(hkv) + " KV head" + (hkv == 1 ? "" : "s") +
         " unevenly, which runs only in ulysses-train; " + what +
         " needs sp to divide the query heads (and to divide the KV heads or be a multiple of "
         "them): export a configuration with such an sp";
}

void refuse_unsupported_mesh(const config::RunConfig& run, const std::string& what) {
  if (auto line = unsupported_mesh(run, what)) throw UserError(*line);
}

std::optional<std::string> local_torch_version() {
  const char* python = std::getenv("ULYSSES_PYTHON");
  const std::string command =
      "timeout 20 " + shell_quote(python && *python ? python : "python3") +
      " -c 'import torch; print(torch.__version__)' </dev/null 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return std::nullopt;
  std::string out;
  char buffer[256];
  while (fgets(buffer, sizeof buffer, pipe)) out += buffer;
  const int status = pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  if (status != 0 || out.empty() || out.find('\n') != std::string::npos) return std::nullopt;
  return out;
}

std::vector<std::string> settle_torch_version_warning(
    std::vector<std::string> warnings, const config::RunConfig& run,
    const std::optional<std::string>& torch_version) {
  const std::optional<std::string> warning = ulysses_torch_version_warning(run);
  std::smatch m;
  static const std::regex kVersion(R"(^(\d+)\.(\d+)(\.|\+|$|[a-z]))");
  if (!warning || !torch_version || !std::regex_search(*torch_version, m, kVersion)) {
    return warnings;
  }
  const int major = std::stoi(m[1].str()), minor = std::stoi(m[2].str());
  const bool new_enough = major > 2 || (major == 2 && minor >= 3);
  for (auto it = warnings.begin(); it != warnings.end(); ++it) {
    if (*it != *warning) continue;
    if (new_enough) {
      warnings.erase(it);
    } else {
      *it += " (found PyTorch " + *torch_version + ")";
    }
    break;
  }
  return warnings;
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
