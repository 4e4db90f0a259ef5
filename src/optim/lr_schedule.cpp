// Warmup + constant/linear/cosine learning-rate schedule; see lr_schedule.h for the formulas.
#include "optim/lr_schedule.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"

namespace ulysses::train {
namespace {
constexpr double kPi = 3.14159265358979323846;
}  // namespace

double lr_at(const config::OptimOptions& options, int64_t step, int64_t total_steps) {
  TORCH_CHECK(step >= 1, "lr_at: step is 1-based, got ", step);
  TORCH_CHECK(total_steps >= 1, "lr_at: total_steps must be >= 1, got ", total_steps);
  const std::string& schedule = options.schedule;
  const bool decays = schedule == "linear" || schedule == "cosine";
  if (!decays && schedule != "constant") {
    throw UserError("optim.schedule: unknown schedule '" + schedule +
                    "' (expected constant, linear or cosine)");
  }
  if (options.warmup_steps < 0) {
    throw UserError(c10::str("optim.warmup_steps: must be >= 0, got ", options.warmup_steps));
  }
  if (!(options.lr >= 0.0)) {
    throw UserError(c10::str("optim.lr: must be >= 0, got ", options.lr));
  }
  if (decays && !(options.min_lr >= 0.0 && options.min_lr <= options.lr)) {
    throw UserError(c10::str("optim.min_lr: must be in [0, optim.lr = ", options.lr, "], got ",
                             options.min_lr));
  }

  const int64_t warmup = options.warmup_steps;
  if (step <= warmup) {
    return options.lr * static_cast<double>(step) / static_cast<double>(warmup);
  }
  if (!decays) {
    return options.lr;
  }
  const double decay_steps = static_cast<double>(std::max<int64_t>(1, total_steps - warmup));
  const double progress = std::clamp(static_cast<double>(step - warmup) / decay_steps, 0.0, 1.0);
  const double factor =
      schedule == "linear" ? 1.0 - progress : 0.5 * (1.0 + std::cos(kPi * progress));
  return options.min_lr + (options.lr - options.min_lr) * factor;
}

}  // namespace ulysses::train
