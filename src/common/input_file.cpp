// Capped whole-file reads of YAML and JSON inputs (see input_file.h).
#include "common/input_file.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <c10/util/Exception.h>

namespace ulysses {

UserError input_too_large(const std::string& source, uint64_t bytes, const std::string& kind,
                          int64_t max_bytes) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  std::string size = std::to_string(bytes) + " bytes";
  std::string cap = std::to_string(max_bytes) + " bytes";
  if (max_bytes > 0 && max_bytes % kMiB == 0) {  // the usual caps: both in MiB
    char mib[32];
    std::snprintf(mib, sizeof mib, "%.1f MiB", static_cast<double>(bytes) / kMiB);
    size = mib;
    cap = std::to_string(max_bytes / kMiB) + " MiB";
  }
  return UserError(source + ": " + size + " is over the " + cap + " limit of " + kind);
}

std::string read_input_file(const std::string& path, const std::string& kind,
                            int64_t max_bytes) {
  TORCH_CHECK(max_bytes >= 0, "read_input_file: negative max_bytes");
  const auto limit = static_cast<uint64_t>(max_bytes);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot read file");
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);  // fails for pipes: read below
  if (!ec && size > limit) throw input_too_large(path, size, kind, max_bytes);
  std::string text;
  char buffer[1 << 16];
  while (text.size() <= limit && in.read(buffer, sizeof buffer).gcount() > 0) {
    text.append(buffer, static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) throw UserError(path + ": cannot read file");
  if (text.size() > limit) throw input_too_large(path, text.size(), kind, max_bytes);
  return text;
}

}  // namespace ulysses
