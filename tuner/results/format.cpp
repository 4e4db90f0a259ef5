// Number and mesh formatting for reports (see format.h).
#include "tuner/results/format.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>

#include "config/mesh_factors.h"
#include "config/run_config.h"

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

// The split of a run config's SP group, read once per distinct config text (a report asks for
// each trial's mesh in several tables).
std::string config_split(const std::string& config_yaml) {
  static std::map<std::string, std::string> known;
  if (const auto it = known.find(config_yaml); it != known.end()) return it->second;
  std::string split;
  try {
    const config::RunConfig c = config::parse_run_config_yaml(config_yaml);
    const int64_t hq = c.model.num_heads, hkv = c.model.num_kv_heads;
    const int64_t ring = config::resolved_sp_ring(c.mesh, hq, hkv);
    split = split_text(c.mesh.sp, ring,
                       c.mesh.uneven_heads && !config::heads_split_evenly(hq, hkv, c.mesh.sp / ring));
  } catch (const std::exception&) {
    // No readable config (an invalid trial's): dp x sp alone.
  }
  return known.emplace(config_yaml, split).first->second;
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
