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

std::string memory_size(std::optional<int64_t> bytes) {
  if (!bytes) return "";
  const double mib = static_cast<double>(*bytes) / (1024.0 * 1024.0);
  const double rounded_mib = mib < 10.0 ? std::round(mib * 10.0) / 10.0 : std::round(mib);
  if (std::abs(rounded_mib) < 1024.0) {
    return fixed(rounded_mib, std::abs(rounded_mib) < 10.0 ? 1 : 0) + " MiB";
  }
  return fixed(mib / 1024.0, 2) + " GiB";
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
