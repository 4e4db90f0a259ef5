// Which trial wins a sweep, and why the others did not. Pure functions over
// the stored trials. The ranking itself is report/objective.h, which `list` and `report` use too,
// so every "best" follows the sweep's objective.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tuner/results/objective.h"
#include "tuner/store/trial_record.h"

namespace ulysses::recommend {

using report::Objective;
using report::qualifies;
using report::rank_trials;

// One configuration (a point of the space) across its trials.
struct PointSummary {
  std::string point;                      // the point's JSON
  const store::TrialRecord* first = nullptr;  // its first trial (names the configuration)
  const store::TrialRecord* best = nullptr;  // its best qualifying trial, if any
  int64_t longest_fit = 0;                // longest qualifying length (0 = none)
  int64_t first_oom = 0;                  // shortest real out-of-memory length (0 = none)
  int64_t oom_trial = 0;
  std::string limited_by;                 // one line: what kept it from winning
  bool tied_with_winner = false;          // its best is tied() with the winner
};

// Per-step records by trial id (store::SweepStore::trial_steps), for the tie rule below.
using StepsByTrial = std::map<int64_t, std::vector<store::TrialStep>>;

// Every point that appears in `trials`, the winner's first, then by how close each came.
// `winner` is rank_trials(...).front(). A point whose best trial reaches the winner's length
// and is tied() with it (by `steps`; none given: no ties) says so in limited_by, with both
// ranges: the winner is first then only by the median of a few steps.
std::vector<PointSummary> summarize_points(const std::vector<store::TrialRecord>& trials,
                                           const Objective& o, const store::TrialRecord& winner,
                                           const StepsByTrial& steps = {});

// The tokens/s per rank of a trial's slowest and fastest measured step: the last
// summary.measured_steps of `steps` (all of them when its summary does not say), each as
// t.tokens_per_s_per_rank x t.step_ms / its step_ms (a step's tokens are the same every step).
// nullopt when there is no measured step with a time, or t has no median.
struct StepRange {
  double slowest = 0.0, fastest = 0.0;  // tokens/s per rank
};
std::optional<StepRange> measured_range(const store::TrialRecord& t,
                                        const std::vector<store::TrialStep>& steps);

// True when two trials cannot be told apart by tokens/s: the ranges of their measured steps
// overlap, i.e. their difference is inside the measured spread of their steps. False when
// either has no range.
bool tied(const store::TrialRecord& a, const std::vector<store::TrialStep>& a_steps,
          const store::TrialRecord& b, const std::vector<store::TrialStep>& b_steps);

}  // namespace ulysses::recommend
