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

// The run-config overrides that value `value` of axis `key` stands for (shorthands expanded).
std::vector<std::string> value_overrides(const std::string& key, const std::string& value) {
  if (auto it = shorthands().find(key); it != shorthands().end()) {
    if (auto v = it->second.find(value); v != it->second.end()) return v->second;
  }
  return {key + "=" + value};
}

// The axes of `e` that `use` accepts, mesh.sp: auto as every sp that divides world_size.
std::vector<AxisSpec> axes_where(const Experiment& e,
                                 const std::function<bool(const std::string&)>& use) {
  std::vector<AxisSpec> out;
  for (const AxisSpec& axis : e.axes) {
    if (!use(axis.key)) continue;
    AxisSpec copy = axis;
    if (axis.key == "mesh.sp" && axis.values == std::vector<std::string>{"auto"}) {
      copy.values.clear();
      for (int64_t sp = 1; sp <= e.world_size; ++sp) {
        if (e.world_size % sp == 0) copy.values.push_back(std::to_string(sp));
      }
    }
    out.push_back(std::move(copy));
  }
  return out;
}

// Calls `f` with the overrides of each combination of the values of `axes`, in order, until it
// returns true or `limit` combinations were tried; true when one did.
bool any_combination(const std::vector<AxisSpec>& axes, int64_t limit,
                     const std::function<bool(const std::vector<std::string>&)>& f) {
  std::vector<size_t> index(axes.size(), 0);
  for (int64_t tried = 0; tried < limit; ++tried) {
    std::vector<std::string> overrides;
    for (size_t i = 0; i < axes.size(); ++i) {
      if (axes[i].values.empty()) return false;
      const std::vector<std::string> more = value_overrides(axes[i].key, axes[i].values[index[i]]);
      overrides.insert(overrides.end(), more.begin(), more.end());
    }
    if (f(overrides)) return true;
    size_t i = 0;  // the next combination, the last axis fastest
    for (; i < axes.size(); ++i) {
      size_t& digit = index[axes.size() - 1 - i];
      if (++digit < axes[axes.size() - 1 - i].values.size()) break;
      digit = 0;
    }
    if (i == axes.size()) return false;  // every combination tried
  }
  return false;
}

// Combinations of the space's mesh and model values tried before the base is refused, or an sp
// of mesh.sp: auto is left out: enough for any space written by hand.
constexpr int64_t kBaseCombinations = 4096;

// The axes that decide whether a mesh is valid: mesh.* and model.* keys.
bool mesh_or_model_key(const std::string& key) {
  return key.rfind("mesh.", 0) == 0 || key.rfind("model.", 0) == 0;
}

// The base must be a valid run config once the space sets its axes: a key it leaves invalid
// (mesh.sp 4 over 3 heads with the space's mesh.sp_ring: [1, 2]) is fine when some choice of the
// space's mesh and model values makes the whole valid. Throws "<file>: base: <config error>" of the base alone
// when none does.
void check_base(const Experiment& e) {
  try {
    base_config(e, {});
  } catch (const UserError&) {
    const bool fixed = any_combination(
        axes_where(e, mesh_or_model_key), kBaseCombinations,
        [&](const std::vector<std::string>& overrides) {
          try {
            base_config(e, overrides);
            return true;
          } catch (const UserError&) {
            return false;
          }
        });
    if (!fixed) throw;
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
  check_base(e);
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
      // An sp is a mesh when some choice of the space's other mesh and model keys makes it one:
      // an uneven split when mesh.uneven_heads may be true, a ring for any mesh.sp_ring value the
      // space lists (auto included), the base's values where the space has no such axis. Its
      // points with the other choices are invalid, each with its reason.
      const std::vector<AxisSpec> others = axes_where(e, [](const std::string& key) {
        return key != "mesh.sp" && mesh_or_model_key(key);
      });
      axis.values.clear();
      for (int64_t sp = 1; sp <= e.world_size; ++sp) {
        if (e.world_size % sp != 0) continue;
        const bool valid = any_combination(
            others, kBaseCombinations, [&](const std::vector<std::string>& other) {
              std::vector<std::string> overrides = other;
              overrides.push_back("mesh.sp=" + std::to_string(sp));
              overrides.push_back("mesh.dp=" + std::to_string(e.world_size / sp));
              try {
                config::RunConfig c = base_config(e, overrides);
                config::validate(c, static_cast<int>(e.world_size));
                return true;
              } catch (const UserError&) {
                return false;  // not a mesh with these values
              }
            });
        if (valid) axis.values.push_back(std::to_string(sp));
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
