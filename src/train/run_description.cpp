// The effective-config echo and its summary.json record (see run_description.h).
#include "train/run_description.h"

#include <yaml-cpp/yaml.h>

#include <map>
#include <sstream>

#include "config/field_table.h"
#include "config/mesh_factors.h"
#include "config/yaml_values.h"
#include "optim/cpu_adam.h"
#include "sp/head_split.h"

namespace ulysses::train {
namespace {

// zero.stage as the trainer runs it: every stage is stage 0 in a world of one.
int64_t effective_zero_stage(const config::RunConfig& config, const ResolvedRun& run) {
  return run.world_size > 1 ? config.zero.stage : 0;
}

// Whether decoder layers recompute in backward: checkpointing (offload implies it), or ZeRO-3,
// which gathers the weights again and recomputes (zero/zero_partition.h).
bool layers_recompute(const config::RunConfig& config, const ResolvedRun& run) {
  return config.memory.checkpointing || config.memory.offload_activations ||
         effective_zero_stage(config, run) == 3;
}

template <class T>
std::string yaml_text(const T& value) {
  YAML::Emitter out;
  out << YAML::Flow;
  config::emit_value(out, value);
  return out.c_str();
}

std::string tiles_text(const config::TileCount& count, int64_t resolved) {
  if (resolved == 1 && count.value == 1) return "off";
  return (count.is_auto() ? std::string("auto -> ") : std::string()) + std::to_string(resolved) +
         " tiles";
}

const char* on_off(bool value) { return value ? "on" : "off"; }

}  // namespace

std::vector<std::string> settings_at_default(const config::RunConfig& config) {
  std::map<std::string, std::string> defaults;
  const config::RunConfig default_config;
  config::for_each_field(default_config, [&](const char* section, const char* key,
                                                  const auto& field) {
    defaults[std::string(section) + "." + key] = yaml_text(field);
  });
  std::vector<std::string> out;
  config::for_each_field(config, [&](const char* section, const char* key, const auto& field) {
    if (std::string(section) == "model") return;
    const std::string path = std::string(section) + "." + key;
    const std::string value = yaml_text(field);
    if (defaults[path] == value) out.push_back(path + "=" + (value.empty() ? "\"\"" : value));
  });
  return out;
}

std::string describe_run(const config::RunConfig& config, const ResolvedRun& run,
                         const std::string& run_yaml_path) {
  const auto& m = config.model;
  const auto& mem = config.memory;
  std::ostringstream out;
  const std::string p = "ulysses-train: ";
  out << p << "effective config (all keys in " << run_yaml_path << "):\n";
  out << p << "  model " << (!m.load.empty() ? m.load : m.preset.empty() ? "inline" : m.preset)
      << ": hidden " << m.hidden_size << ", " << m.num_layers << " layers, " << m.num_heads
      << " heads (" << m.num_kv_heads << " kv, head_dim " << m.head_dim << "), ffn "
      << m.intermediate_size << ", vocab " << m.vocab_size << ", " << run.parameters
      << " parameters\n";
  out << p << "  mesh dp " << run.dp << " x sp " << run.sp << " (world " << run.world_size
      << "), device " << run.device << ", attention " << run.attention << "\n";
  const int64_t ring = config::resolved_sp_ring(config.mesh, m.num_heads, m.num_kv_heads);
  const int64_t a2a = run.sp / ring;
  if (ring > 1) {
    out << p << "  sp " << run.sp << " = all-to-all " << a2a << " x ring " << ring
        << " (mesh.sp_ring): ring blocks of " << run.local_length * a2a
        << " positions, two zig-zag chunks each\n";
  }
  if (a2a > 1 && config.mesh.uneven_heads &&
      !sp::heads_split_evenly(m.num_heads, m.num_kv_heads, a2a)) {
    std::string query, kv;
    for (int64_t r = 0; r < a2a; ++r) {
      const sp::RankHeads heads = sp::uneven_rank_heads(m.num_heads, m.num_kv_heads, a2a, r);
      if (r > 0) query += ", ", kv += ", ";
      query += std::to_string(heads.q_count);
      kv += std::to_string(heads.kv_count);
    }
    out << p << "  heads split unevenly over the all-to-all (mesh.uneven_heads): query " << query
        << "; kv "
        << kv << " per rank\n";
  }
  out << p << "  sequence " << config.sequence.length << " tokens (padded " << run.padded_length
      << ", " << run.local_length << " per rank), micro_batch " << config.sequence.micro_batch
      << ", grad_accum " << config.sequence.grad_accum << ": " << run.global_batch
      << " samples = " << run.global_batch * run.padded_length << " tokens per step\n";
  out << p << "  data " << config.data.source;
  if (config.data.source.rfind("tokens:", 0) == 0) out << " (" << config.data.token_dtype << ")";
  out << (config.data.pack ? ", packed" : "") << "; " << config.train.steps << " steps, lr "
      << config::format_double(config.optim.lr) << " " << config.optim.schedule << "\n";
  const int64_t zero_stage = effective_zero_stage(config, run);
  out << p << "  memory: tiled_mlp " << tiles_text(mem.tiled_mlp, run.mlp_tiles) << ", tiled_loss "
      << tiles_text(mem.tiled_loss, run.loss_tiles) << ", checkpointing "
      << on_off(layers_recompute(config, run))
      << (zero_stage == 3 && !mem.checkpointing && !mem.offload_activations ? " (ZeRO-3)" : "")
      << ", offload_activations " << on_off(mem.offload_activations) << ", offload_optimizer "
      << on_off(mem.offload_optimizer)
      << (mem.offload_optimizer && !mem.offload_gradients ? " (gradients on the device)" : "")
      << (run.host_threads > 0 ? " (" + std::to_string(run.host_threads) + " host threads)" : "")
      << ", precision " << mem.precision << ", limit "
      << (mem.limit_gib > 0 ? config::format_double(mem.limit_gib) + " GiB" : "none")
      << ", zero stage " << zero_stage << "\n";
  out << p << "  outputs in " << config.output.dir;
  if (!config.checkpoint.dir.empty()) {
    out << ", checkpoints in " << config.checkpoint.dir << " ("
        << (config.checkpoint.every > 0
                ? "every " + std::to_string(config.checkpoint.every) + " steps and "
                : std::string())
        << "at the end)";
  }
  out << "\n";
  const std::vector<std::string> defaults = settings_at_default(config);
  std::string line = p + "  defaults taken:";
  for (const auto& setting : defaults) {
    if (line.size() + setting.size() > 110) {
      out << line << "\n";
      line = p + "   ";
    }
    line += " " + setting;
  }
  out << line << "\n";
  return out.str();
}

nlohmann::json resolved_run_json(const config::RunConfig& config, const ResolvedRun& run) {
  const auto& mem = config.memory;
  return {{"memory",
           {{"tiled_mlp", mem.tiled_mlp.is_auto() ? "auto" : std::to_string(mem.tiled_mlp.value)},
            {"tiled_mlp_tiles", run.mlp_tiles},
            {"tiled_loss", mem.tiled_loss.is_auto() ? "auto" : std::to_string(mem.tiled_loss.value)},
            {"tiled_loss_tiles", run.loss_tiles},
            {"checkpointing", layers_recompute(config, run)},
            {"zero_stage", effective_zero_stage(config, run)},
            {"offload_activations", mem.offload_activations},
            {"offload_optimizer", mem.offload_optimizer},
            {"offload_gradients", mem.offload_gradients},
            {"optimizer_host_threads", run.host_threads},
            {"optimizer_host_isa", run.host_threads > 0 ? nlohmann::json(fused_adamw_isa())
                                                        : nlohmann::json(nullptr)},
            {"precision", mem.precision},
            {"limit_gib", mem.limit_gib}}},
          {"resolved",
           {{"sequence_length", config.sequence.length},
            {"padded_length", run.padded_length},
            {"local_length", run.local_length},
            {"micro_batch", config.sequence.micro_batch},
            {"grad_accum", config.sequence.grad_accum},
            {"global_batch", run.global_batch},
            {"tokens_per_step", run.global_batch * run.padded_length},
            {"parameters", run.parameters},
            {"attention", run.attention},
            {"steps", config.train.steps}}}};
}

}  // namespace ulysses::train
