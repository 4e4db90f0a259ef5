// Reading and checking experiment files (see experiment.h).
#include "tuner/experiment/experiment.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "common/error.h"
#include "common/paths.h"
#include "config/yaml_reader.h"
#include "config/yaml_values.h"
#include "tuner/calibrate/hardware_profile.h"
#include "tuner/experiment/training_data.h"

namespace ulysses::experiment {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kTopKeys = {
    "name",     "description", "hardware", "model",     "world_size", "nproc",
    "memory_limit_gib", "base", "space",   "objective", "target_length", "headroom",
    "budget",   "trial",       "search",   "runner",   "nodes",     "backend",
    "slots",    "isolation"};

// Errors name the file and the key: "<source>: <key>: <what>".
struct Reader {
  std::string source;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw UserError(source + ": " + key + ": " + what);
  }
  // Re-throws a config reader's "<key>: <what>" with the file in front.
  template <typename T>
  void read(const YAML::Node& node, const std::string& key, T& out) const {
    try {
      config::read_value(node, key, out);
    } catch (const UserError& e) {
      throw UserError(source + ": " + e.what());
    }
  }
  void keys(const YAML::Node& map, const std::string& prefix,
            const std::vector<std::string>& known) const {
    try {
      config::check_keys(map, prefix, known);
    } catch (const UserError& e) {
      throw UserError(source + ": " + e.what());
    }
  }
};

// A profile given as a name (profiles/<kind>/<name>.yaml) or as a path to a .yaml file.
std::string resolve_profile(const Reader& r, const std::string& key, const std::string& value,
                            const std::string& profiles_dir, const std::string& kind,
                            const std::string& experiment_dir) {
  std::vector<fs::path> candidates;
  if (value.find('/') != std::string::npos || value.ends_with(".yaml")) {
    candidates.push_back(fs::path(value));
    if (!experiment_dir.empty()) candidates.push_back(fs::path(experiment_dir) / value);
  } else {
    candidates.push_back(fs::path(profiles_dir) / kind / (value + ".yaml"));
  }
  for (const fs::path& p : candidates) {
    if (fs::is_regular_file(p)) return p.string();
  }
  r.fail(key, "no profile '" + value + "' (looked for " + candidates.front().string() + ")");
}

std::vector<std::string> scalar_list(const Reader& r, const YAML::Node& node,
                                     const std::string& key) {
  std::vector<std::string> values;
  if (node.IsScalar()) {
    values.push_back(node.Scalar());
  } else if (node.IsSequence()) {
    for (const YAML::Node& item : node) {
      if (!item.IsScalar()) r.fail(key, "expected a list of values, got " + config::describe(item));
      values.push_back(item.Scalar());
    }
  } else {
    r.fail(key, "expected a value or a list of values, got " + config::describe(node));
  }
  if (values.empty()) r.fail(key, "empty list of values");
  for (size_t i = 0; i < values.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (values[i] == values[j]) r.fail(key, "value '" + values[i] + "' listed twice");
    }
  }
  return values;
}

LengthSpec read_lengths(const Reader& r, const YAML::Node& node) {
  const std::string key = "space.sequence.length";
  LengthSpec spec;
  if (config::is_mapping(node)) {
    r.keys(node, key + ".", {"search", "from", "to", "step", "curve"});
    std::string search;
    int64_t from = 0, to = 0, step = 0;
    if (!node["search"].IsDefined()) r.fail(key + ".search", "missing (search: max)");
    r.read(node["search"], key + ".search", search);
    if (search != "max") r.fail(key + ".search", "expected max, got '" + search + "'");
    for (auto [name, out] : {std::pair{"from", &from}, {"to", &to}, {"step", &step}}) {
      if (!node[name].IsDefined()) r.fail(key + "." + name, "missing");
      r.read(node[name], key + "." + name, *out);
    }
    if (from < 1) r.fail(key + ".from", "must be >= 1, got " + std::to_string(from));
    if (step < 1) r.fail(key + ".step", "must be >= 1, got " + std::to_string(step));
    if (to < from) {
      r.fail(key + ".to", std::to_string(to) + " is below from " + std::to_string(from));
    }
    if (node["curve"].IsDefined()) {
      r.read(node["curve"], key + ".curve", spec.curve);
      if (spec.curve < 0 || spec.curve > 16) {
        r.fail(key + ".curve",
               "must be 0 to 16 shorter lengths, got " + std::to_string(spec.curve));
      }
    }
    spec.search_max = true;
    for (int64_t l = from; l <= to; l += step) spec.values.push_back(l);
    return spec;
  }
  for (const std::string& text : scalar_list(r, node, key)) {
    int64_t length = 0;
    r.read(YAML::Node(text), key, length);
    if (length < 1) r.fail(key, "lengths must be >= 1, got " + text);
    spec.values.push_back(length);
  }
  std::sort(spec.values.begin(), spec.values.end());
  return spec;
}

// base.<section>.source naming files (tokens:PATH, megatron:PREFIX) with a relative path: found
// as profiles are (the working directory first, then beside the experiment) and made absolute,
// since trials run in directories of their own and a recommended config is launched from
// anywhere. The files must exist and read: a sweep on missing data fails before any trial.
// Returns what the section names, read once (synthetic when it names no source).
TrainingData resolve_data_path(const Reader& r, YAML::Node& base, const std::string& section,
                               const std::string& experiment_dir) {
  config::DataOptions options;
  if (!config::is_mapping(base[section]) || !base[section]["source"].IsDefined()) {
    return read_training_data(options, "base." + section + ".source");
  }
  const std::string key = "base." + section + ".source";
  std::string& source = options.source;
  r.read(base[section]["source"], key, source);
  for (const std::string kind : {"tokens:", "megatron:"}) {
    if (!source.starts_with(kind) || source.size() == kind.size()) continue;
    const fs::path path = source.substr(kind.size());
    const std::string probe = kind == "megatron:" ? ".idx" : "";
    std::vector<fs::path> candidates = {path};
    if (path.is_relative() && !experiment_dir.empty()) {
      candidates.push_back(fs::path(experiment_dir) / path);
    }
    std::error_code ec;
    const auto found = std::find_if(candidates.begin(), candidates.end(), [&](const fs::path& p) {
      return fs::exists(p.string() + probe, ec);
    });
    if (found == candidates.end()) {
      r.fail(key, source + ": no " + path.string() + probe +
                      (candidates.size() > 1 ? " in the working directory or beside the experiment"
                                             : ""));
    }
    source = kind + fs::absolute(*found).lexically_normal().string();
    base[section]["source"] = source;
  }
  // What else of the section decides what a trial reads (the data section's own keys).
  const YAML::Node node = base[section];
  if (node["seed"].IsDefined()) r.read(node["seed"], "base." + section + ".seed", options.seed);
  if (node["pack"].IsDefined()) r.read(node["pack"], "base." + section + ".pack", options.pack);
  if (node["packing"].IsDefined()) {
    r.read(node["packing"], "base." + section + ".packing", options.packing);
  }
  if (node["loss_mask"].IsDefined()) {
    r.read(node["loss_mask"], "base." + section + ".loss_mask", options.loss_mask);
  }
  try {
    return read_training_data(options, key);
  } catch (const UserError& err) {
    throw UserError(r.source + ": " + err.what());
  }
}

}  // namespace

Experiment parse_experiment(const std::string& text, const std::string& source,
                            const std::string& profiles_dir) {
  const Reader r{source};
  const YAML::Node root = config::parse_yaml(text, source);
  if (!config::is_mapping(root)) r.fail("experiment", "expected a mapping of keys");
  r.keys(root, "", kTopKeys);
  Experiment e;
  e.path = source;
  e.yaml = text;
  const std::string dir = fs::path(source).parent_path().string();

  if (!root["name"].IsDefined()) r.fail("name", "missing");
  r.read(root["name"], "name", e.name);
  try {
    check_sweep_name("name", e.name);
  } catch (const UserError& err) {
    throw UserError(source + ": " + err.what());
  }
  if (root["description"].IsDefined()) r.read(root["description"], "description", e.description);

  if (!root["hardware"].IsDefined()) r.fail("hardware", "missing (a profiles/hardware/ name)");
  r.read(root["hardware"], "hardware", e.hardware);
  e.hardware_path = resolve_profile(r, "hardware", e.hardware, profiles_dir, "hardware", dir);
  const calibrate::HardwareProfile hw = calibrate::load_hardware_profile(e.hardware_path);
  e.runner = hw.runner;

  YAML::Node base = root["base"].IsDefined() ? YAML::Clone(root["base"]) : YAML::Node();
  if (base.IsDefined() && !base.IsNull() && !base.IsMap()) {
    r.fail("base", "expected a run config mapping, got " + config::describe(base));
  }
  if (root["model"].IsDefined()) {
    r.read(root["model"], "model", e.model);
    resolve_profile(r, "model", e.model, profiles_dir, "models", dir);
    if (config::is_mapping(base) && config::is_mapping(base["model"]) &&
        base["model"]["preset"].IsDefined()) {
      r.fail("model", "given twice (also base.model.preset)");
    }
    base["model"]["preset"] = e.model;
  }
  if (!base.IsDefined() || base.IsNull()) base = YAML::Node(YAML::NodeType::Map);
  e.data = resolve_data_path(r, base, "data", dir);
  resolve_data_path(r, base, "eval", dir);
  if (config::is_mapping(base["train"]) && base["train"]["device"].IsDefined()) {
    r.read(base["train"]["device"], "base.train.device", e.device);
  }
  YAML::Emitter out;
  out << base;
  e.base_yaml = out.c_str();

  if (root["world_size"].IsDefined() && root["nproc"].IsDefined()) {
    r.fail("nproc", "give world_size or nproc, not both");
  }
  const char* world_key = root["nproc"].IsDefined() ? "nproc" : "world_size";
  e.world_size = hw.world_size();
  if (root[world_key].IsDefined()) r.read(root[world_key], world_key, e.world_size);
  if (e.world_size < 1) r.fail(world_key, "must be >= 1");

  e.memory_limit_gib = hw.device_memory_gib;
  if (root["memory_limit_gib"].IsDefined()) {
    r.read(root["memory_limit_gib"], "memory_limit_gib", e.memory_limit_gib);
    e.memory_limit_given = true;
  }
  if (e.memory_limit_gib < 0) r.fail("memory_limit_gib", "must be >= 0 (0 = no limit)");

  const YAML::Node space = root["space"];
  if (!config::is_mapping(space) || space.size() == 0) {
    r.fail("space", "empty: give at least sequence.length and one axis");
  }
  for (const auto& entry : space) {
    const std::string key = entry.first.Scalar();
    if (key == "sequence.length") {
      e.lengths = read_lengths(r, entry.second);
      continue;
    }
    if (key.find('.') == std::string::npos) {
      r.fail("space." + key, "expected a run-config key path such as memory.tiled_mlp");
    }
    for (const AxisSpec& axis : e.axes) {
      if (axis.key == key) r.fail("space." + key, "duplicate key");
    }
    e.axes.push_back({key, scalar_list(r, entry.second, "space." + key)});
  }
  if (e.lengths.values.empty()) r.fail("space.sequence.length", "missing (a list or {search: max, ...})");

  if (root["objective"].IsDefined()) r.read(root["objective"], "objective", e.objective);
  if (e.objective != "throughput" && e.objective != "max-seqlen") {
    r.fail("objective", "expected throughput or max-seqlen, got '" + e.objective + "'");
  }
  e.target_length = e.lengths.values.back();
  if (root["target_length"].IsDefined()) {
    if (e.objective != "throughput") r.fail("target_length", "only for objective: throughput");
    r.read(root["target_length"], "target_length", e.target_length);
    if (std::find(e.lengths.values.begin(), e.lengths.values.end(), e.target_length) ==
        e.lengths.values.end()) {
      r.fail("target_length", std::to_string(e.target_length) + " is not in space.sequence.length");
    }
  }
  if (e.objective == "throughput" && e.lengths.search_max && !root["target_length"].IsDefined()) {
    r.fail("target_length", "required for objective: throughput with a max-length search");
  }
  if (root["headroom"].IsDefined()) r.read(root["headroom"], "headroom", e.headroom);
  if (e.headroom < 0 || e.headroom >= 1) r.fail("headroom", "must be in [0, 1)");

  if (const YAML::Node b = root["budget"]; b.IsDefined()) {
    r.keys(b, "budget.", {"max_trials", "wall_clock_s", "trial_timeout_s"});
    if (b["max_trials"].IsDefined()) r.read(b["max_trials"], "budget.max_trials", e.budget.max_trials);
    if (b["wall_clock_s"].IsDefined()) r.read(b["wall_clock_s"], "budget.wall_clock_s", e.budget.wall_clock_s);
    if (b["trial_timeout_s"].IsDefined()) {
      r.read(b["trial_timeout_s"], "budget.trial_timeout_s", e.budget.trial_timeout_s);
    }
    if (e.budget.max_trials < 0) r.fail("budget.max_trials", "must be >= 0 (0 = no limit)");
    if (e.budget.wall_clock_s < 0) r.fail("budget.wall_clock_s", "must be >= 0 (0 = no limit)");
    if (e.budget.trial_timeout_s <= 0) r.fail("budget.trial_timeout_s", "must be > 0");
  }
  if (const YAML::Node t = root["trial"]; t.IsDefined()) {
    r.keys(t, "trial.", {"warmup_steps", "steps"});
    if (t["warmup_steps"].IsDefined()) r.read(t["warmup_steps"], "trial.warmup_steps", e.warmup_steps);
    if (t["steps"].IsDefined()) r.read(t["steps"], "trial.steps", e.measured_steps);
    if (e.warmup_steps < 0) r.fail("trial.warmup_steps", "must be >= 0");
    if (e.measured_steps < 1) r.fail("trial.steps", "must be >= 1");
  }
  if (const YAML::Node s = root["search"]; s.IsDefined()) {
    r.keys(s, "search.", {"method", "probe", "prune"});
    if (s["method"].IsDefined()) r.read(s["method"], "search.method", e.method);
    if (s["probe"].IsDefined()) r.read(s["probe"], "search.probe", e.probe);
    if (s["prune"].IsDefined()) r.read(s["prune"], "search.prune", e.prune);
    if (e.method != "smart" && e.method != "grid") {
      r.fail("search.method", "expected smart or grid, got '" + e.method + "'");
    }
  }
  if (root["backend"].IsDefined()) {
    e.backends = scalar_list(r, root["backend"], "backend");
    for (const std::string& b : e.backends) {  // scalar_list refuses repeated values
      if (b != "native" && b != "deepspeed") {
        r.fail("backend", "expected native or deepspeed (or a list of them), got '" + b + "'");
      }
    }
    const bool deepspeed =
        std::find(e.backends.begin(), e.backends.end(), "deepspeed") != e.backends.end();
    if (deepspeed && e.probe && e.lengths.search_max) {
      r.fail("search.probe", "a memory probe skips attention in all but the last layer, which "
                             "only the native backend can do; set search.probe: false with "
                             "backend: deepspeed");
    }
  }
  if (root["runner"].IsDefined()) r.read(root["runner"], "runner", e.runner);
  if (e.runner != "local" && e.runner != "srun") {
    r.fail("runner", "expected local or srun, got '" + e.runner + "'");
  }
  if (root["nodes"].IsDefined()) {
    r.read(root["nodes"], "nodes", e.nodes);
    if (e.nodes < 1) r.fail("nodes", "must be >= 1");
    if (e.world_size % e.nodes != 0) {
      r.fail("nodes", std::to_string(e.world_size) + " ranks do not spread evenly over " +
                          std::to_string(e.nodes) + " nodes");
    }
    if (e.nodes > 1 && e.runner == "local") r.fail("nodes", "more than 1 needs runner: srun");
  } else if (e.runner == "srun") {
    // As many of the hardware's nodes as the ranks fill, spread evenly.
    const int64_t filled = (e.world_size + hw.devices_per_node - 1) / hw.devices_per_node;
    e.nodes = std::max<int64_t>(1, std::min(hw.nodes, filled));
    while (e.world_size % e.nodes != 0) --e.nodes;
  }
  if (root["slots"].IsDefined()) {
    std::string slots;
    r.read(root["slots"], "slots", slots);
    try {
      e.slots = parse_slots("slots", slots);
    } catch (const UserError& error) {
      throw UserError(r.source + ": " + error.what());
    }
  }
  if (root["isolation"].IsDefined()) r.read(root["isolation"], "isolation", e.isolation);
  if (e.isolation != "offload_alone" && e.isolation != "shared" && e.isolation != "all_alone") {
    r.fail("isolation",
           "expected offload_alone, shared or all_alone, got '" + e.isolation + "'");
  }
  return e;
}

int64_t parse_slots(const std::string& field, const std::string& text) {
  if (text == "auto") return 0;
  int64_t slots = 0;
  try {
    size_t used = 0;
    slots = std::stoll(text, &used);
    if (used != text.size()) slots = 0;
  } catch (const std::exception&) {
    slots = 0;
  }
  if (slots < 1) {
    throw UserError(field + ": expected a whole number >= 1 or auto, got '" + text + "'");
  }
  return slots;
}

std::string default_profiles_dir() {
  const std::string home = project_home();
  return home.empty() ? "profiles" : (fs::path(home) / "profiles").string();
}

Experiment load_experiment(const std::string& path, const std::string& profiles_dir) {
  Experiment e = parse_experiment(config::read_yaml_text(path), path, profiles_dir);
  e.path = path;
  return e;
}

void check_sweep_name(const std::string& field, const std::string& name) {
  if (name.empty()) throw UserError(field + ": must not be empty");
  const bool allowed = std::all_of(name.begin(), name.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-';
  });
  if (allowed && name != "." && name != "..") return;
  std::string shown;
  for (char ch : name.substr(0, 64)) {
    if (std::isprint(static_cast<unsigned char>(ch))) {
      shown += ch;
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", static_cast<unsigned char>(ch));
      shown += escaped;
    }
  }
  if (name.size() > 64) shown += "...";
  throw UserError(field + ": '" + shown +
                  "' is not a sweep name (letters, digits, '.', '_' and '-' only, not '.' or "
                  "'..': it names a directory and goes into generated scripts)");
}

}  // namespace ulysses::experiment
