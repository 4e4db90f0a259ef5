// Which trial wins a sweep, and why the others did not (SPEC 7 "Recommend"). Pure functions over
// the stored trials, so `recommend`, `export` and the tests share one definition of "best".
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tuner/store/trial_record.h"

namespace ulysses::recommend {

struct Objective {
  std::string kind = "throughput";  // throughput | max-seqlen
  int64_t target_length = 0;        // throughput: the length it is measured at
  double headroom = 0.1;            // a trial qualifies when peak <= (1 - headroom) * limit
  bool check_peak = true;           // false on CPU, where trials already ran under the reduced
                                    // limit (the kernel enforced it)
};

// True when `t` may be recommended: ok, not a probe, within the head-room when check_peak.
bool qualifies(const store::TrialRecord& t, const Objective& o);

// The qualifying trials, best first: throughput -> at target_length, by tokens/s per rank;
// max-seqlen -> by length, then tokens/s per rank. Ties: lower trial id first.
std::vector<const store::TrialRecord*> rank_trials(const std::vector<store::TrialRecord>& trials,
                                                   const Objective& o);

// One configuration (a point of the space) across its trials.
struct PointSummary {
  std::string point;                      // the point's JSON
  const store::TrialRecord* first = nullptr;  // its first trial (names the configuration)
  const store::TrialRecord* best = nullptr;  // its best qualifying trial, if any
  int64_t longest_fit = 0;                // longest qualifying length (0 = none)
  int64_t first_oom = 0;                  // shortest real out-of-memory length (0 = none)
  int64_t oom_trial = 0;
  std::string limited_by;                 // one line: what kept it from winning
};

// Every point that appears in `trials`, the winner's first, then by how close each came.
// `winner` is rank_trials(...).front().
std::vector<PointSummary> summarize_points(const std::vector<store::TrialRecord>& trials,
                                           const Objective& o, const store::TrialRecord& winner);

}  // namespace ulysses::recommend
