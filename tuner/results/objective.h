// What a sweep optimises and the one ranking of its trials by it. `list`, `report` and
// `recommend` (recommend/ranking.h) name as "best" the trial rank_trials() puts first under the
// sweep's objective; nothing else may call a trial best.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tuner/store/trial_record.h"

namespace ulysses::report {

struct Objective {
  std::string kind = "throughput";  // throughput | max-seqlen
  int64_t target_length = 0;        // throughput: the length it is measured at
  double headroom = 0.1;            // a trial qualifies when its peak above the start-up
                                    // baseline (memory_basis.h) <= (1 - headroom) * limit
  bool check_peak = true;           // false on CPU, where trials already ran under the reduced
                                    // limit (the kernel enforced it)
};

// The objective sweep `sweep` ran with, read from its experiment file as stored with it:
// objective, target_length, headroom, and check_peak = (base.train.device is cuda).
// Throws UserError "sweep NAME: <experiment error>" when the stored file cannot be read (e.g. its
// hardware profile is gone).
Objective sweep_objective(const store::SweepRecord& sweep);

// "max-seqlen" or "throughput at 4096 tokens".
std::string describe(const Objective& o);

// True when `t` may be ranked: ok, not a memory probe, and (check_peak) its peak above the
// baseline within the head-room of its limit.
bool qualifies(const store::TrialRecord& t, const Objective& o);

// True when `a` ranks before `b` (both qualify): max-seqlen -> longer first, then more tokens/s
// per rank; throughput -> more tokens/s per rank. Ties: the lower trial id first.
bool ranks_before(const store::TrialRecord& a, const store::TrialRecord& b, const Objective& o);

// The qualifying trials, best first (ranks_before); throughput keeps only those at
// target_length. Pointers into `trials`.
std::vector<const store::TrialRecord*> rank_trials(const std::vector<store::TrialRecord>& trials,
                                                   const Objective& o);

}  // namespace ulysses::report
