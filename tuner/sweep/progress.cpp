// Progress lines of a sweep (see progress.h).
#include "tuner/sweep/progress.h"

#include <cstdio>

namespace ulysses::sweep {

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buffer[32];
  if (s >= 3600) {
    std::snprintf(buffer, sizeof buffer, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  } else if (s >= 60) {
    std::snprintf(buffer, sizeof buffer, "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(buffer, sizeof buffer, "%llds", static_cast<long long>(s));
  }
  return buffer;
}

Progress::Progress(int64_t expected_runs)
    : expected_(expected_runs), start_(std::chrono::steady_clock::now()) {}

double Progress::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::finished(const std::string& what, const std::string& status,
                        const std::string& detail, bool replayed) {
  ++runs_;
  replayed_ += replayed;
  const double elapsed = elapsed_s();
  std::string eta = "?";
  if (expected_ > runs_ && runs_ > replayed_) {
    eta = format_duration(elapsed / static_cast<double>(runs_ - replayed_) * (expected_ - runs_));
  }
  if (expected_ > 0 && expected_ <= runs_) eta = "0s";
  std::printf("[%lld/~%lld %s eta %s] %s -> %s%s%s | best: %s\n", static_cast<long long>(runs_),
              static_cast<long long>(expected_ > runs_ ? expected_ : runs_),
              format_duration(elapsed).c_str(), eta.c_str(), what.c_str(), status.c_str(),
              detail.empty() ? "" : " ", detail.c_str(), best_.empty() ? "-" : best_.c_str());
  std::fflush(stdout);
}

void Progress::not_run(const std::string& what, const std::string& status,
                       const std::string& reason) {
  std::printf("  %s: %s (%s)\n", status.c_str(), what.c_str(), reason.c_str());
  std::fflush(stdout);
}

}  // namespace ulysses::sweep
