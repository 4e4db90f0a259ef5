// --set overrides: parse "section.key=value", check the path against the field table, and write
// the value into the YAML document.
#include "config/overrides.h"

#include <algorithm>

#include "common/error.h"
#include "config/field_table.h"
#include "config/yaml_reader.h"
#include "config/yaml_values.h"

namespace ulysses::config {

Override parse_override(const std::string& text) {
  const UserError malformed("--set " + text + ": expected key.path=value");
  const size_t equals = text.find('=');
  if (equals == std::string::npos) throw malformed;
  const std::string path = text.substr(0, equals);
  const size_t dot = path.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == path.size() ||
      path.find('.', dot + 1) != std::string::npos) {
    throw malformed;
  }

  Override result;
  result.section = path.substr(0, dot);
  result.key = path.substr(dot + 1);
  const std::vector<std::string>& sections = section_names();
  if (std::find(sections.begin(), sections.end(), result.section) == sections.end()) {
    throw unknown_key_error("", result.section, sections);
  }
  const std::vector<std::string> keys = section_keys(result.section);
  if (std::find(keys.begin(), keys.end(), result.key) == keys.end()) {
    throw unknown_key_error(result.section + ".", result.key, keys);
  }

  const std::string value_text = text.substr(equals + 1);
  try {
    result.value = YAML::Load(value_text);
  } catch (const YAML::Exception&) {
    result.value = YAML::Node(value_text);  // not YAML: the literal text
  }
  // No key takes a mapping, so "a: b" is meant literally (e.g. a path holding ": ").
  if (result.value.IsMap()) result.value = YAML::Node(value_text);
  return result;
}

void apply_overrides(YAML::Node& root, const std::vector<std::string>& overrides) {
  if (overrides.empty()) return;
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) {
    throw UserError("document: expected a mapping of keys, got " + describe(root));
  }
  for (const std::string& text : overrides) {
    const Override item = parse_override(text);
    YAML::Node section = root[item.section];
    if (section.IsDefined() && !section.IsNull() && !section.IsMap()) {
      throw UserError(item.section + ": expected a mapping of keys, got " + describe(section));
    }
    section[item.key] = item.value;
  }
}

}  // namespace ulysses::config
