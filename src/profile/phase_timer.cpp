// Process-wide phase accumulator (see phase_timer.h).
#include "profile/phase_timer.h"

namespace ulysses::profile {
namespace {
PhaseTimes& accumulated() {
  static PhaseTimes times;
  return times;
}
}  // namespace

PhaseTimes take_phase_times() {
  PhaseTimes out;
  out.swap(accumulated());
  return out;
}

void add_phase_time(const std::string& name, double ms) { accumulated()[name] += ms; }

}  // namespace ulysses::profile
