// How loaded the machine was while a sweep's trials ran, for the reports' headers: timings of a
// quiet machine and of a loaded one are not comparable, so every report says which it was.
#pragma once
#include <string>
#include <vector>

#include "tuner/store/trial_record.h"

namespace ulysses::report {

// One line for people: "1-minute load average 0.52 min, 1.10 median, 2.30 max over the start
// and end of 12 trials; 2 cores", from every start_load_1m and end_load_1m recorded (cores: the
// most any trial recorded, left out when unknown). "not recorded (the sweep was run by a
// ulysses-tune that did not record it)" when `loads` holds no reading.
std::string machine_load_text(const std::vector<store::TrialLoad>& loads);

}  // namespace ulysses::report
