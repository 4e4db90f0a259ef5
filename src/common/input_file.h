// Reading an input file (YAML, JSON) whole before it is parsed, with a size cap, so that a hostile
// or mistaken file (a huge config.json, /dev/zero) cannot exhaust memory or the parser.
#pragma once
#include <cstdint>
#include <string>

#include "common/error.h"

namespace ulysses {

// The cap on every YAML or JSON input: far above any real one (configs, profiles, experiments,
// summaries, indexes are kilobytes), low enough that reading it whole is harmless.
inline constexpr int64_t kMaxInputFileBytes = int64_t{16} << 20;  // 16 MiB

// The contents of the file at `path` when it holds at most `max_bytes` bytes. Reading stops once
// past the cap, whatever the file claims to be (a FIFO, /dev/zero). `kind` names the file in the
// size error ("a YAML document", "a JSON file").
// Throws UserError "<path>: cannot read file", or input_too_large(path, ...) when it is longer.
// REQUIRES: max_bytes >= 0.
std::string read_input_file(const std::string& path, const std::string& kind,
                            int64_t max_bytes = kMaxInputFileBytes);

// The size error for `source` (a path, or what names an in-memory text) holding `bytes` bytes:
// UserError "<source>: 17.0 MiB is over the 16 MiB limit of <kind>" (both in bytes when the cap
// is not a whole number of MiB).
UserError input_too_large(const std::string& source, uint64_t bytes, const std::string& kind,
                          int64_t max_bytes = kMaxInputFileBytes);

}  // namespace ulysses
