// Loading a run config: parse, apply --set overrides, check keys, resolve the model, validate.
#include "config/run_config.h"

#include "common/error.h"
#include "config/hf_config.h"
#include "config/overrides.h"
#include "config/presets.h"
#include "config/yaml_reader.h"
#include "config/yaml_values.h"

namespace ulysses::config {
namespace {

// model.<key> as written in the document ("" when absent).
std::string model_string(const YAML::Node& root, const char* key) {
  std::string value;
  if (!is_mapping(root) || !is_mapping(root["model"])) return value;
  const YAML::Node node = root["model"][key];
  if (node.IsDefined()) read_value(node, std::string("model.") + key, value);
  return value;
}

RunConfig resolve(YAML::Node root, const std::vector<std::string>& overrides) {
  apply_overrides(root, overrides);
  const YAML::Node& document = root;  // const: operator[] must not insert missing keys
  check_run_config_keys(document);

  RunConfig config;
  const std::string preset = model_string(document, "preset");
  const std::string load = model_string(document, "load");
  if (!preset.empty() && !load.empty()) {
    throw UserError("model.load: cannot be combined with model.preset '" + preset +
                    "' (shapes come from " + load + "/config.json)");
  }
  if (!preset.empty()) config.model = load_model_preset(preset);
  if (!load.empty()) config.model = read_hf_config(load);
  read_present_fields(document, config);
  validate(config, -1);
  return config;
}

}  // namespace

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  return resolve(load_yaml_file(path), overrides);
}

RunConfig parse_run_config_yaml(const std::string& text,
                                const std::vector<std::string>& overrides) {
  return resolve(parse_yaml(text, "run config"), overrides);
}

}  // namespace ulysses::config
