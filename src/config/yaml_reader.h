// Reading run-config YAML documents: parsing with file/line errors, the unknown-key check, and
// copying the keys present in a document onto option structs (absent keys keep their values).
#pragma once
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/input_file.h"
#include "config/options.h"

namespace ulysses::config {

// True when `node` exists and is a mapping. (yaml-cpp throws on most calls on the node that
// operator[] returns for a missing key; IsDefined() is the safe first question.)
inline bool is_mapping(const YAML::Node& node) { return node.IsDefined() && node.IsMap(); }

// The largest YAML document read (run configs, presets, experiments, profiles): the cap of every
// input file (common/input_file.h). (Nesting depth is yaml-cpp's own limit.)
inline constexpr int64_t kMaxYamlBytes = kMaxInputFileBytes;  // 16 MiB

// Parses YAML text. `source` names the text in errors: UserError
// "<source>: line L, column C: <what yaml-cpp says>", or "<source>: <size> is over the 16 MiB
// limit of a YAML document" when text is longer than kMaxYamlBytes (nothing is parsed).
YAML::Node parse_yaml(const std::string& text, const std::string& source);

// The text of a YAML file, read only when it is at most kMaxYamlBytes. Throws UserError
// "<path>: cannot read file" when it cannot be opened, or the size error of parse_yaml.
std::string read_yaml_text(const std::string& path);

// read_yaml_text + parse_yaml.
YAML::Node load_yaml_file(const std::string& path);

// The error for a key that is not in `known`: "<prefix><key>: unknown key", plus
// " (did you mean <prefix><closest>?)" when a known key is within two edits, or else when a
// known key starts with `key` or `key` starts with it (both at least 3 characters: "warmup" ->
// "warmup_steps"), the nearest of those by edit distance.
UserError unknown_key_error(const std::string& prefix, const std::string& key,
                            const std::vector<std::string>& known);

// Checks that `map` (a mapping, or empty) holds only keys from `known`, each once.
// `prefix` is prepended to key names in errors ("memory."). Throws UserError
// "<prefix><key>: unknown key ...", "<prefix><key>: duplicate key", or, when `map` is not a
// mapping, "<what>: expected a mapping of keys, got ..." with what = prefix without its dot.
void check_keys(const YAML::Node& map, const std::string& prefix,
                const std::vector<std::string>& known);

// Checks every section and key of a run-config document against the field table.
void check_run_config_keys(const YAML::Node& root);

// Copies each key present under `root` (sections and keys of the field table) onto `config`.
// REQUIRES: check_run_config_keys(root) passed. Throws read_value's UserErrors.
void read_present_fields(const YAML::Node& root, RunConfig& config);

// Copies each key present in the mapping `model` onto `out` (the model keys of the table).
// REQUIRES: check_keys(model, ...) passed.
void read_present_model_fields(const YAML::Node& model, ModelOptions& out);

}  // namespace ulysses::config
