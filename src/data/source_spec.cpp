// Parsing of data source strings (see source_spec.h).
#include "data/source_spec.h"

#include "common/error.h"

namespace ulysses::data {
namespace {

// True when `text` starts with `prefix`; then `rest` receives what follows it.
bool strip_prefix(const std::string& text, const std::string& prefix, std::string* rest) {
  if (text.compare(0, prefix.size(), prefix) != 0) return false;
  *rest = text.substr(prefix.size());
  return true;
}

}  // namespace

SourceSpec parse_source(const std::string& source, const std::string& key) {
  SourceSpec spec;
  if (source == "synthetic") return spec;
  std::string path;
  if (strip_prefix(source, "tokens:", &path)) {
    spec.kind = SourceKind::kTokens;
  } else if (strip_prefix(source, "megatron:", &path)) {
    spec.kind = SourceKind::kMegatron;
  } else {
    throw UserError(key + ": unknown data source '" + source +
                    "' (expected synthetic, tokens:PATH or megatron:PREFIX)");
  }
  if (path.empty()) {
    throw UserError(key + ": '" + source + "' needs a path after the colon");
  }
  spec.path = path;
  return spec;
}

const char* source_kind_name(SourceKind kind) {
  switch (kind) {
    case SourceKind::kSynthetic:
      return "synthetic";
    case SourceKind::kTokens:
      return "tokens";
    case SourceKind::kMegatron:
      return "megatron";
  }
  return "unknown";
}

}  // namespace ulysses::data
