// What of an experiment decides its trials' results (see result_inputs.h).
#include "tuner/experiment/result_inputs.h"

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <cstdio>

#include "config/run_config.h"
#include "config/yaml_reader.h"
#include "config/yaml_values.h"
#include "tuner/experiment/training_data.h"

namespace ulysses::experiment {
namespace {

std::string join(const std::vector<std::string>& values) {
  std::string out;
  for (const std::string& v : values) out += (out.empty() ? "" : ", ") + v;
  return out;
}

// A YAML node as text without comments or the file's layout.
std::string canonical(const YAML::Node& node) {
  YAML::Emitter out;
  out << node;
  return out.c_str();
}

// A YAML value on one line: scalars as they are, sequences and maps in flow style.
std::string one_line(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

// Every leaf of a YAML map as ("<prefix><key path>", value on one line), in document order.
void flatten(const YAML::Node& node, const std::string& prefix, std::vector<ResultInput>* out) {
  if (!node.IsMap()) {
    out->push_back({prefix.substr(0, prefix.size() - 1), one_line(node)});
    return;
  }
  for (const auto& entry : node) {
    flatten(entry.second, prefix + entry.first.Scalar() + ".", out);
  }
}

// The base run config with the model resolved and every default written, less what every
// trial sets itself (plan_trial): those keys of the base never reach a trial.
config::RunConfig trial_base(const Experiment& e) {
  config::RunConfig c = config::parse_run_config_yaml(e.base_yaml);
  const config::RunConfig defaults;
  c.mesh.dp = defaults.mesh.dp;
  c.sequence.length = defaults.sequence.length;
  c.train.steps = defaults.train.steps;
  c.profile.warmup_steps = defaults.profile.warmup_steps;
  c.memory.limit_gib = defaults.memory.limit_gib;
  c.output = defaults.output;
  c.checkpoint.dir = defaults.checkpoint.dir;
  c.checkpoint.resume = defaults.checkpoint.resume;
  c.eval.source = defaults.eval.source;
  c.attention.skip_all_but_last = defaults.attention.skip_all_but_last;
  return c;
}

}  // namespace

std::string digest_of(const std::string& text) {
  uint64_t hash = 14695981039346656037ull;  // 64-bit FNV-1a
  for (unsigned char ch : text) {
    hash ^= ch;
    hash *= 1099511628211ull;
  }
  char out[32];
  std::snprintf(out, sizeof out, "fnv1a64:%016llx", static_cast<unsigned long long>(hash));
  return out;
}

std::vector<ResultInput> result_inputs(const Experiment& e) {
  std::vector<ResultInput> in = {
      {"world_size", std::to_string(e.world_size)},
      {"nodes", std::to_string(e.nodes)},
      {"device", e.device},
      {"memory_limit_gib", config::format_double(e.memory_limit_gib)},
      {"headroom", config::format_double(e.headroom)},
  };
  // The whole base run config as written, resolved (model preset or HF config, defaults), key by
  // key: even what every trial overrides (train.steps, ...) is what the user ran the sweep with.
  flatten(YAML::Load(config::to_yaml(config::parse_run_config_yaml(e.base_yaml))), "base.", &in);
  std::vector<std::string> axis_keys;
  for (const AxisSpec& axis : e.axes) axis_keys.push_back(axis.key);
  in.push_back({"space", join(axis_keys)});
  for (const AxisSpec& axis : e.axes) in.push_back({"space." + axis.key, join(axis.values)});
  std::vector<std::string> lengths;
  for (int64_t l : e.lengths.values) lengths.push_back(std::to_string(l));
  in.push_back({"space.sequence.length",
                (e.lengths.search_max ? "search max over " : "") + join(lengths)});
  in.push_back({"objective", e.objective});
  in.push_back({"target_length", std::to_string(e.target_length)});
  in.push_back({"budget.trial_timeout_s", config::format_double(e.budget.trial_timeout_s)});
  in.push_back({"trial.warmup_steps", std::to_string(e.warmup_steps)});
  in.push_back({"trial.steps", std::to_string(e.measured_steps)});
  in.push_back({"search.method", e.method});
  return in;
}

std::string first_difference(const std::vector<ResultInput>& before,
                             const std::vector<ResultInput>& now) {
  for (const ResultInput& a : before) {
    const ResultInput* b = nullptr;
    for (const ResultInput& candidate : now) {
      if (candidate.key == a.key) b = &candidate;
    }
    if (b == nullptr || b->value != a.value) return a.key;
  }
  for (const ResultInput& b : now) {
    bool known = false;
    for (const ResultInput& a : before) known = known || a.key == b.key;
    if (!known) return b.key;
  }
  return "";
}

std::map<std::string, std::string> profile_digests(const Experiment& e) {
  YAML::Node hardware = config::load_yaml_file(e.hardware_path);
  if (hardware.IsMap()) {  // what it is called and how it is described decide nothing
    hardware.remove("name");
    hardware.remove("description");
  }
  const config::RunConfig base = trial_base(e);
  std::map<std::string, std::string> digests = {
      {"hardware_profile", digest_of(canonical(hardware))},
      {"model", digest_of(canonical(YAML::Load(config::to_yaml(base))["model"]))}};
  if (!e.data.digest.empty()) digests["data"] = e.data.digest;
  return digests;
}

}  // namespace ulysses::experiment
