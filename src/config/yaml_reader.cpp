// Parsing run-config documents and checking their keys against the field table.
#include "config/yaml_reader.h"

#include <algorithm>
#include <set>

#include "common/input_file.h"
#include "config/field_table.h"
#include "config/yaml_values.h"

namespace ulysses::config {
namespace {

// How the size error names a YAML input.
constexpr const char* kYamlKind = "a YAML document";

// Levenshtein distance, for "did you mean" suggestions.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

YAML::Node parse_yaml(const std::string& text, const std::string& source) {
  if (text.size() > static_cast<size_t>(kMaxYamlBytes)) {
    throw input_too_large(source, text.size(), kYamlKind, kMaxYamlBytes);
  }
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    std::string where = source;
    if (!e.mark.is_null()) {
      where += ": line " + std::to_string(e.mark.line + 1) + ", column " +
               std::to_string(e.mark.column + 1);
    }
    throw UserError(where + ": " + e.msg);
  }
}

std::string read_yaml_text(const std::string& path) {
  return read_input_file(path, kYamlKind, kMaxYamlBytes);
}

YAML::Node load_yaml_file(const std::string& path) {
  return parse_yaml(read_yaml_text(path), path);
}

UserError unknown_key_error(const std::string& prefix, const std::string& key,
                            const std::vector<std::string>& known) {
  std::string message = prefix + key + ": unknown key";
  const std::string* closest = nullptr;
  size_t best = 3;  // suggest only within two edits
  for (const std::string& candidate : known) {
    const size_t distance = edit_distance(key, candidate);
    if (distance < best) {
      best = distance;
      closest = &candidate;
    }
  }
  if (closest == nullptr) {
    // A shortened or lengthened key ("warmup" for "warmup_steps") is many edits away: suggest
    // the known key that starts with it, or that it starts with (the nearest when several do).
    for (const std::string& candidate : known) {
      if (key.size() < 3 || candidate.size() < 3) continue;
      const bool shortened = candidate.rfind(key, 0) == 0;
      const bool lengthened = key.rfind(candidate, 0) == 0;
      if (!shortened && !lengthened) continue;
      const size_t distance = edit_distance(key, candidate);
      if (closest == nullptr || distance < best) {
        best = distance;
        closest = &candidate;
      }
    }
  }
  if (closest != nullptr) message += " (did you mean " + prefix + *closest + "?)";
  return UserError(message);
}

void check_keys(const YAML::Node& map, const std::string& prefix,
                const std::vector<std::string>& known) {
  if (!map.IsDefined() || map.IsNull()) return;
  if (!map.IsMap()) {
    const std::string what = prefix.empty() ? "document" : prefix.substr(0, prefix.size() - 1);
    throw UserError(what + ": expected a mapping of keys, got " + describe(map));
  }
  std::set<std::string> seen;
  for (const auto& entry : map) {
    if (!entry.first.IsScalar()) {
      throw UserError(prefix + describe(entry.first) + ": expected a key name");
    }
    const std::string key = entry.first.Scalar();
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      throw unknown_key_error(prefix, key, known);
    }
    if (!seen.insert(key).second) throw UserError(prefix + key + ": duplicate key");
  }
}

void check_run_config_keys(const YAML::Node& root) {
  check_keys(root, "", section_names());
  if (!is_mapping(root)) return;
  for (const std::string& section : section_names()) {
    check_keys(root[section], section + ".", section_keys(section));
  }
}

void read_present_fields(const YAML::Node& root, RunConfig& config) {
  if (!is_mapping(root)) return;
  for_each_field(config, [&](const char* section, const char* key, auto& field) {
    const YAML::Node section_node = root[section];
    if (!is_mapping(section_node)) return;
    const YAML::Node value = section_node[key];
    if (value.IsDefined()) read_value(value, std::string(section) + "." + key, field);
  });
}

void read_present_model_fields(const YAML::Node& model, ModelOptions& out) {
  if (!is_mapping(model)) return;
  for_each_model_field(out, [&](const char* key, auto& field) {
    const YAML::Node value = model[key];
    if (value.IsDefined()) read_value(value, std::string("model.") + key, field);
  });
}

}  // namespace ulysses::config
