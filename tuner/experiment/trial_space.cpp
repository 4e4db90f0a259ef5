// The experiment's space, its memory orders and the run config of a trial (see trial_space.h).
#include "tuner/experiment/trial_space.h"

#include <functional>
#include <map>

#include "common/error.h"
#include "config/overrides.h"
#include "config/run_config.h"
#include "config/yaml_values.h"
#include "tuner/calibrate/hardware_profile.h"

namespace ulysses::experiment {
namespace {

// Shorthand axes: each value stands for a list of run-config overrides.
const std::map<std::string, std::map<std::string, std::vector<std::string>>>& shorthands() {
  static const std::map<std::string, std::map<std::string, std::vector<std::string>>> table = {
      {"memory.offload",
       {{"none", {"memory.offload_activations=false", "memory.offload_optimizer=false"}},
        {"activations", {"memory.offload_activations=true", "memory.offload_optimizer=false"}},
        {"optimizer", {"memory.offload_activations=false", "memory.offload_optimizer=true"}},
        {"both", {"memory.offload_activations=true", "memory.offload_optimizer=true"}}}},
  };
  return table;
}

bool truthy(const std::string& v) { return v == "true" || v == "yes" || v == "on" || v == "1"; }
int64_t as_int(const std::string& v) {
  int64_t out = 0;
  config::read_value(YAML::Node(v), "value", out);
  return out;
}

// Memory order of the axes where it is known (turning on tiling, checkpointing or an
// offload never raises peak memory; neither does a smaller micro-batch or a higher ZeRO stage).
// Higher rank = saves at least as much; equal ranks of different values are incomparable.
const std::map<std::string, std::function<int(const std::string&)>>& memory_orders() {
  static const std::map<std::string, std::function<int(const std::string&)>> table = {
      {"memory.tiled_mlp", [](const std::string& v) { return v == "1" ? 0 : 1; }},
      {"memory.tiled_loss", [](const std::string& v) { return v == "1" ? 0 : 1; }},
      {"memory.checkpointing", [](const std::string& v) { return truthy(v) ? 1 : 0; }},
      {"memory.offload_activations", [](const std::string& v) { return truthy(v) ? 1 : 0; }},
      {"memory.offload_optimizer", [](const std::string& v) { return truthy(v) ? 1 : 0; }},
      {"memory.offload",
       [](const std::string& v) { return v == "none" ? 0 : (v == "both" ? 2 : 1); }},
      {"sequence.micro_batch", [](const std::string& v) { return static_cast<int>(-as_int(v)); }},
      {"zero.stage", [](const std::string& v) { return static_cast<int>(as_int(v)); }},
  };
  return table;
}

// Axes whose memory savings need not cost time, left out of dominance (search/space.h): a
// higher ZeRO stage reduce-scatters instead of all-reducing and steps a 1/world optimizer shard;
// tiled logits+loss computes each tile's backward inside the forward (no recompute) and never
// writes the full [bs, T, V] fp32 logits.
bool saving_may_save_time(const std::string& key) {
  return key == "zero.stage" || key == "memory.tiled_loss";
}

config::RunConfig base_config(const Experiment& e, const std::vector<std::string>& overrides) {
  try {
    return config::parse_run_config_yaml(e.base_yaml, overrides);
  } catch (const UserError& err) {
    throw UserError(e.path + ": base: " + err.what());
  }
}

void check_axis_key(const Experiment& e, const AxisSpec& axis) {
  const std::string where = e.path + ": space." + axis.key + ": ";
  if (axis.key == "mesh.dp") throw UserError(where + "derived (world_size / mesh.sp), not an axis");
  if (auto it = shorthands().find(axis.key); it != shorthands().end()) {
    for (const std::string& v : axis.values) {
      if (!it->second.count(v)) {
        std::string known;
        for (const auto& [name, _] : it->second) known += (known.empty() ? "" : "|") + name;
        throw UserError(where + "unknown value '" + v + "' (expected " + known + ")");
      }
    }
    return;
  }
  try {
    config::parse_override(axis.key + "=" + axis.values.front());
  } catch (const UserError& err) {
    throw UserError(e.path + ": space." + std::string(err.what()));
  }
}

}  // namespace

search::Space build_space(const Experiment& e) {
  base_config(e, {});  // the base itself must be valid
  search::Space space;
  space.lengths = e.lengths.values;
  space.search_max = e.lengths.search_max;
  space.curve = static_cast<int>(e.lengths.curve);
  if (e.backends != std::vector<std::string>{"native"}) {
    // Unordered: no memory or time is assumed of one backend against the other.
    space.axes.push_back(search::Axis{kBackendAxis, e.backends, {}});
  }
  for (const AxisSpec& spec : e.axes) {
    search::Axis axis{spec.key, spec.values, {}};
    if (spec.key == "mesh.sp" && spec.values.size() == 1 && spec.values[0] == "auto") {
      // An sp that splits the heads unevenly is a valid mesh when the base sets
      // mesh.uneven_heads or the space may set it (its trials with the key off are invalid).
      std::vector<std::string> mesh_overrides;
      for (const AxisSpec& other : e.axes) {
        if (other.key != "mesh.uneven_heads") continue;
        for (const std::string& v : other.values) {
          if (truthy(v)) mesh_overrides = {"mesh.uneven_heads=true"};
        }
      }
      axis.values.clear();
      for (int64_t sp = 1; sp <= e.world_size; ++sp) {
        if (e.world_size % sp != 0) continue;
        try {
          std::vector<std::string> overrides = mesh_overrides;
          overrides.push_back("mesh.sp=" + std::to_string(sp));
          overrides.push_back("mesh.dp=" + std::to_string(e.world_size / sp));
          config::RunConfig c = base_config(e, overrides);
          config::validate(c, static_cast<int>(e.world_size));
          axis.values.push_back(std::to_string(sp));
        } catch (const UserError&) {
          // not a valid mesh for this model: auto leaves it out
        }
      }
      if (axis.values.empty()) {
        throw UserError(e.path + ": space.mesh.sp: auto finds no sp that divides world_size " +
                        std::to_string(e.world_size) + " and fits the model's heads");
      }
    }
    check_axis_key(e, {axis.key, axis.values});
    if (auto it = memory_orders().find(axis.key); it != memory_orders().end()) {
      for (const std::string& v : axis.values) axis.saving.push_back(it->second(v));
    }
    axis.saving_costs_time = !saving_may_save_time(axis.key);
    space.axes.push_back(std::move(axis));
  }
  return space;
}

std::vector<std::string> point_overrides(const search::Space& space, const search::Point& p) {
  std::vector<std::string> out;
  for (size_t i = 0; i < space.axes.size(); ++i) {
    const search::Axis& axis = space.axes[i];
    const std::string& value = axis.values[p[i]];
    if (axis.key == kBackendAxis) continue;  // not a run-config key
    if (auto it = shorthands().find(axis.key); it != shorthands().end()) {
      const std::vector<std::string>& expanded = it->second.at(value);
      out.insert(out.end(), expanded.begin(), expanded.end());
    } else {
      out.push_back(axis.key + "=" + value);
    }
  }
  return out;
}

std::string point_backend(const search::Space& space, const search::Point& p) {
  for (size_t i = 0; i < space.axes.size(); ++i) {
    if (space.axes[i].key == kBackendAxis) return space.axes[i].values[p[i]];
  }
  return "native";
}

double trial_memory_limit_gib(const Experiment& e) {
  return e.device == "cuda" ? e.memory_limit_gib : e.memory_limit_gib * (1.0 - e.headroom);
}

TrialPlan plan_trial(const Experiment& e, const search::Space& space, const search::Point& p,
                     int64_t length, bool probe, const std::string& output_dir) {
  std::vector<std::string> overrides = point_overrides(space, p);
  // mesh.sp from the point, else from the base; dp completes the world.
  config::RunConfig first = config::parse_run_config_yaml(e.base_yaml, overrides);
  const int64_t sp = first.mesh.sp;
  if (e.world_size % sp != 0) {
    throw UserError("mesh.sp: " + std::to_string(sp) + " does not divide world_size " +
                    std::to_string(e.world_size));
  }
  overrides.push_back("mesh.dp=" + std::to_string(e.world_size / sp));
  // The device's peak for the trial's precision, so that summary.json has MFU; a peak the base
  // config sets wins.
  if (!(first.profile.peak_tflops > 0) && !e.hardware_path.empty()) {
    const double peak =
        calibrate::load_hardware_profile(e.hardware_path).peak_tflops(first.memory.precision);
    if (peak > 0) overrides.push_back("profile.peak_tflops=" + config::format_double(peak));
  }
  overrides.push_back("sequence.length=" + std::to_string(length));
  overrides.push_back("train.steps=" + std::to_string(e.warmup_steps + e.measured_steps));
  overrides.push_back("profile.warmup_steps=" + std::to_string(e.warmup_steps));
  overrides.push_back("memory.limit_gib=" + config::format_double(trial_memory_limit_gib(e)));
  overrides.push_back("output.dir=" + output_dir);
  overrides.push_back("checkpoint.dir=");  // trials write no checkpoints and run no evaluation
  overrides.push_back("checkpoint.resume=");
  overrides.push_back("eval.source=");
  overrides.push_back(std::string("attention.skip_all_but_last=") + (probe ? "true" : "false"));
  TrialPlan plan{config::parse_run_config_yaml(e.base_yaml, overrides), ""};
  config::validate(plan.config, static_cast<int>(e.world_size));
  plan.yaml = config::to_yaml(plan.config);
  return plan;
}

}  // namespace ulysses::experiment
