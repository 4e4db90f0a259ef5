// WHY.md of `ulysses-tune recommend`: why the recommended configuration won, the top candidates
// side by side, what limited every other configuration, and where each candidate's time went.
#pragma once
#include <string>
#include <vector>

#include "tuner/recommend/ranking.h"
#include "tuner/store/trial_record.h"

namespace ulysses::recommend {

// phases[i] are the stored phases of summaries[i].best (empty when it has none).
std::string render_why(const store::SweepRecord& sweep, const Objective& o,
                       const store::TrialRecord& winner, const std::vector<PointSummary>& summaries,
                       const std::vector<std::vector<store::TrialPhase>>& phases);

}  // namespace ulysses::recommend
