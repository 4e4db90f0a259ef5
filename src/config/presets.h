// Model presets: profiles/models/<name>.yaml under project_home(), each a `model:` mapping with
// the keys of the run config's model section (all but `preset`).
#pragma once
#include <string>
#include <vector>

#include "config/options.h"

namespace ulysses::config {

// The preset names found in <project_home()>/profiles/models (file stems of *.yaml), sorted.
// Empty when there is no such directory.
std::vector<std::string> available_presets();

// The file a preset refers to: `name` itself when it contains '/' or ends in .yaml/.yml (a
// user's own model file), else <project_home()>/profiles/models/<name>.yaml.
std::string preset_path(const std::string& name);

// ModelOptions defaults overlaid with the preset's fields; `preset` stays "" (the caller records
// the name). Throws UserError
//   "model.preset: unknown preset 'x' (available: a, b, ...)"  when the file does not exist,
//   "<file>: <what>"                                           for a bad file (syntax, keys,
//   types).
ModelOptions load_model_preset(const std::string& name);

}  // namespace ulysses::config
