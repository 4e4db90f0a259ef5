// RunConfig -> YAML text, walking the field table so that every key is written.
#include <yaml-cpp/yaml.h>

#include <string>

#include "config/field_table.h"
#include "config/run_config.h"
#include "config/yaml_values.h"

namespace ulysses::config {

std::string to_yaml(const RunConfig& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string open_section;
  for_each_field(config, [&](const char* section, const char* key, const auto& field) {
    if (open_section != section) {
      if (!open_section.empty()) out << YAML::EndMap;
      out << YAML::Key << section << YAML::Value << YAML::BeginMap;
      open_section = section;
    }
    out << YAML::Key << key << YAML::Value;
    emit_value(out, field);
  });
  out << YAML::EndMap << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace ulysses::config
