// `--set key.path=value` overrides of a run config, applied to the parsed YAML document before it
// is read, so an override behaves exactly as if the file had said it.
#pragma once
#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

namespace ulysses::config {

// One parsed override: `section.key` and its value parsed as YAML (a scalar, or a flow list such
// as [0.9,0.99]; text that is not valid YAML or reads as a mapping is taken as a plain string;
// "a.b=" is empty).
struct Override {
  std::string section;
  std::string key;
  YAML::Node value;
};

// Parses "section.key=value". Throws UserError "--set <text>: expected key.path=value" when
// there is no '=' or the path is not two dot-separated names, and
// "<section.key>: unknown key (...)" when the path is not in the run-config field table.
Override parse_override(const std::string& text);

// Applies the overrides in order (a later one wins) to `root`, a run-config document (a mapping
// or empty). Throws parse_override's errors, and "<section>: expected a mapping of keys, got ..."
// when the document holds that section as something other than a mapping.
void apply_overrides(YAML::Node& root, const std::vector<std::string>& overrides);

}  // namespace ulysses::config
