// The meaning of every run-config key, one sentence each, and the reference page generated from
// them and the field table (field_table.h gives the keys, their types and defaults), so that
// docs/run-config.md cannot drift from the code: `ulysses-train --print-config-reference`.
#pragma once
#include <string>
#include <vector>

namespace ulysses::config {

// The meaning of "section.key" (e.g. "memory.tiled_mlp"), or "" when it has none.
std::string field_meaning(const std::string& key_path);

// The keys of the field table that have no meaning written ("section.key", table order). Empty
// when every key is documented.
std::vector<std::string> undocumented_keys();

// The documented keys that are not in the field table (left behind when a key was removed).
std::vector<std::string> stale_documented_keys();

// The run-config reference as Markdown: per section, a table of key, type, default (the
// options.h default, as YAML) and meaning, in field-table order. Deterministic: equal to the
// committed docs/run-config.md (tests/docs checks it).
std::string config_reference_markdown();

}  // namespace ulysses::config
