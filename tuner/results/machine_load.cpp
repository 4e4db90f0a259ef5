// The machine's load over a sweep's trials (see machine_load.h).
#include "tuner/results/machine_load.h"

#include <algorithm>

#include "tuner/results/format.h"

namespace ulysses::report {

std::string machine_load_text(const std::vector<store::TrialLoad>& loads) {
  std::vector<double> readings;
  int64_t trials = 0, cores = 0;
  for (const store::TrialLoad& load : loads) {
    const size_t before = readings.size();
    if (load.start_load_1m) readings.push_back(*load.start_load_1m);
    if (load.end_load_1m) readings.push_back(*load.end_load_1m);
    trials += readings.size() > before;
    cores = std::max(cores, load.cores);
  }
  if (readings.empty()) {
    return "not recorded (the sweep was run by a ulysses-tune that did not record it)";
  }
  std::sort(readings.begin(), readings.end());
  const size_t n = readings.size();
  const double median = n % 2 ? readings[n / 2] : 0.5 * (readings[n / 2 - 1] + readings[n / 2]);
  std::string text = "1-minute load average " + fixed(readings.front(), 2) + " min, " +
                     fixed(median, 2) + " median, " + fixed(readings.back(), 2) +
                     " max over the start and end of " + std::to_string(trials) +
                     (trials == 1 ? " trial" : " trials");
  if (cores > 0) text += "; " + std::to_string(cores) + (cores == 1 ? " core" : " cores");
  return text;
}

}  // namespace ulysses::report
