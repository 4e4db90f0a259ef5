// Number and mesh formatting for reports (see format.h).
#include "tuner/results/format.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <exception>

#include <yaml-cpp/yaml.h>

#include "config/mesh_factors.h"
#include "config/options.h"
#include "config/yaml_values.h"

namespace ulysses::report {

std::string fixed(std::optional<double> value, int decimals) {
  if (!value || std::isnan(*value)) return "";
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", decimals, *value);
  return buffer;
}

std::string memory_size(std::optional<int64_t> bytes) {
  if (!bytes) return "";
  const double mib = static_cast<double>(*bytes) / (1024.0 * 1024.0);
  const double rounded_mib = mib < 10.0 ? std::round(mib * 10.0) / 10.0 : std::round(mib);
  if (std::abs(rounded_mib) < 1024.0) {
    return fixed(rounded_mib, std::abs(rounded_mib) < 10.0 ? 1 : 0) + " MiB";
  }
  return fixed(mib / 1024.0, 2) + " GiB";
}

std::string exact(std::optional<double> value) {
  if (!value) return "";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), *value);
  return std::string(buffer, result.ptr);
}

std::string exact(std::optional<int64_t> value) { return value ? std::to_string(*value) : ""; }

namespace {

std::string split_text(int64_t sp, int64_t sp_ring, bool uneven) {
  std::string out;
  if (sp_ring > 1) {
    out += " (" + std::to_string(sp / sp_ring) + " a2a x " + std::to_string(sp_ring) + " ring)";
  }
  return uneven ? out + " uneven" : out;
}

// The split of a stored run config's SP group (config::to_yaml writes every key), read from its
// mesh.* and model.* keys alone (a missing key keeps its default): no model.load file is read and
// no rule applied, so a database copied off the machine, or a config a later rule refuses, still
// prints its split. "" when the keys cannot be read (an invalid trial without a config).
std::string config_split(const std::string& config_yaml) {
  try {
    const YAML::Node root = YAML::Load(config_yaml);
    config::MeshOptions mesh;
    config::ModelOptions model;
    const auto read = [](const YAML::Node& node, const char* path, auto& field) {
      if (node) config::read_value(node, path, field);
    };
    read(root["mesh"]["sp"], "mesh.sp", mesh.sp);
    read(root["mesh"]["sp_ring"], "mesh.sp_ring", mesh.sp_ring);
    read(root["mesh"]["uneven_heads"], "mesh.uneven_heads", mesh.uneven_heads);
    read(root["model"]["num_heads"], "model.num_heads", model.num_heads);
    read(root["model"]["num_kv_heads"], "model.num_kv_heads", model.num_kv_heads);
    const int64_t hq = model.num_heads, hkv = model.num_kv_heads;
    if (mesh.sp < 1 || hq < 1 || hkv < 1) return "";
    const int64_t ring = config::resolved_sp_ring(mesh, hq, hkv);
    if (ring < 1 || mesh.sp % ring != 0) return "";
    return split_text(mesh.sp, ring,
                      mesh.uneven_heads && !config::heads_split_evenly(hq, hkv, mesh.sp / ring));
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace

std::string mesh_text(int64_t dp, int64_t sp, int64_t sp_ring, bool uneven) {
  return std::to_string(dp) + "x" + std::to_string(sp) + split_text(sp, sp_ring, uneven);
}

std::string mesh_split(const store::TrialRecord& trial) {
  return trial.config_yaml.empty() ? std::string() : config_split(trial.config_yaml);
}

std::string mesh(const store::TrialRecord& trial) {
  return std::to_string(trial.dp) + "x" + std::to_string(trial.sp) + mesh_split(trial);
}

}  // namespace ulysses::report
