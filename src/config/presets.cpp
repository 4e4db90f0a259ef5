// Model presets under profiles/models/.
#include "config/presets.h"

#include <algorithm>
#include <filesystem>

#include "common/error.h"
#include "common/paths.h"
#include "config/field_table.h"
#include "config/yaml_reader.h"

namespace fs = std::filesystem;

namespace ulysses::config {
namespace {

fs::path presets_dir() {
  const std::string home = project_home();
  return home.empty() ? fs::path() : fs::path(home) / "profiles" / "models";
}

bool is_yaml_name(const std::string& name) {
  const std::string ext = fs::path(name).extension().string();
  return ext == ".yaml" || ext == ".yml";
}

// Keys a preset file may set: every model key but `preset` (presets do not chain).
std::vector<std::string> preset_keys() {
  std::vector<std::string> keys;
  const ModelOptions defaults;
  for_each_model_field(defaults, [&](const char* key, const auto&) {
    if (std::string(key) != "preset") keys.push_back(key);
  });
  return keys;
}

}  // namespace

std::vector<std::string> available_presets() {
  std::vector<std::string> names;
  std::error_code ec;
  const fs::path dir = presets_dir();
  if (dir.empty() || !fs::is_directory(dir, ec)) return names;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_regular_file(ec) && entry.path().extension() == ".yaml") {
      names.push_back(entry.path().stem().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string preset_path(const std::string& name) {
  if (name.find('/') != std::string::npos || is_yaml_name(name)) return name;
  const fs::path dir = presets_dir();
  return dir.empty() ? std::string() : (dir / (name + ".yaml")).string();
}

ModelOptions load_model_preset(const std::string& name) {
  const std::string path = preset_path(name);
  std::error_code ec;
  if (path.empty() || !fs::is_regular_file(path, ec)) {
    if (path == name) throw UserError("model.preset: file '" + name + "' does not exist");
    std::string available;
    for (const std::string& preset : available_presets()) {
      available += (available.empty() ? "" : ", ") + preset;
    }
    const std::string unknown = "model.preset: unknown preset '" + name + "' ";
    if (available.empty()) {
      const std::string where = path.empty() ? "no profiles/models directory found"
                                             : "no presets in " + presets_dir().string();
      throw UserError(unknown + "(" + where + "; set ULYSSES_HOME to the project root)");
    }
    throw UserError(unknown + "(available: " + available + ")");
  }

  ModelOptions model;
  try {
    const YAML::Node root = load_yaml_file(path);
    check_keys(root, "", {"model"});
    const YAML::Node fields = root["model"];
    if (!is_mapping(fields)) throw UserError("model: expected a mapping of keys");
    check_keys(fields, "model.", preset_keys());
    read_present_model_fields(fields, model);
  } catch (const UserError& e) {
    const std::string what = e.what();
    if (what.rfind(path, 0) == 0) throw;  // already names the file
    throw UserError(path + ": " + what);
  }
  return model;
}

}  // namespace ulysses::config
