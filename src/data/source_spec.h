// A data source string parsed into its kind and path: "synthetic", "tokens:PATH" (flat
// uint16/uint32 token file) or "megatron:PREFIX" (Megatron-LM PREFIX.bin + PREFIX.idx).
#pragma once
#include <string>

namespace ulysses::data {

enum class SourceKind { kSynthetic, kTokens, kMegatron };

struct SourceSpec {
  SourceKind kind = SourceKind::kSynthetic;
  std::string path;  // the token file (kTokens), the prefix without .bin/.idx (kMegatron), "" else
};

// Returns the parsed `source`. Throws UserError("<key>: ...") when the kind is unknown or the path
// after "tokens:" / "megatron:" is empty. `key` names the config field the string came from
// (data.source, eval.source).
SourceSpec parse_source(const std::string& source, const std::string& key = "data.source");

// "synthetic", "tokens" or "megatron", for messages.
const char* source_kind_name(SourceKind kind);

}  // namespace ulysses::data
