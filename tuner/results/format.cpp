// Number and mesh formatting for reports (see format.h).
#include "tuner/results/format.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace ulysses::report {

std::string fixed(std::optional<double> value, int decimals) {
  if (!value || std::isnan(*value)) return "";
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", decimals, *value);
  return buffer;
}

std::string gib(std::optional<int64_t> bytes) {
  if (!bytes) return "";
  return fixed(static_cast<double>(*bytes) / (1024.0 * 1024.0 * 1024.0), 2);
}

std::string exact(std::optional<double> value) {
  if (!value) return "";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), *value);
  return std::string(buffer, result.ptr);
}

std::string exact(std::optional<int64_t> value) { return value ? std::to_string(*value) : ""; }

std::string mesh(const store::TrialRecord& trial) {
  return std::to_string(trial.dp) + "x" + std::to_string(trial.sp);
}

}  // namespace ulysses::report
