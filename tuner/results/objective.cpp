// The sweep's objective and the ranking of trials by it (see objective.h).
#include "tuner/results/objective.h"

#include <algorithm>

#include "common/error.h"
#include "tuner/experiment/experiment.h"
#include "tuner/results/memory_basis.h"

namespace ulysses::report {
namespace {

double tokens_per_s(const store::TrialRecord& t) { return t.tokens_per_s_per_rank.value_or(0.0); }

}  // namespace

Objective sweep_objective(const store::SweepRecord& sweep) {
  try {
    const experiment::Experiment e =
        experiment::parse_experiment(sweep.experiment_yaml, sweep.experiment_path,
                                     experiment::default_profiles_dir());
    Objective o;
    o.kind = e.objective;
    o.target_length = e.target_length;
    o.headroom = e.headroom;
    o.check_peak = e.device == "cuda";
    return o;
  } catch (const UserError& error) {
    throw UserError("sweep " + sweep.name + ": " + error.what());
  }
}

std::string describe(const Objective& o) {
  if (o.kind != "throughput") return o.kind;
  return "throughput at " + std::to_string(o.target_length) + " tokens";
}

bool qualifies(const store::TrialRecord& t, const Objective& o) {
  if (t.status != "ok" || t.probe) return false;
  const std::optional<int64_t> peak = peak_above_baseline(t);
  if (o.check_peak && t.limit_bytes && *t.limit_bytes > 0 && peak) {
    return static_cast<double>(*peak) <= (1.0 - o.headroom) * static_cast<double>(*t.limit_bytes);
  }
  return true;
}

bool ranks_before(const store::TrialRecord& a, const store::TrialRecord& b, const Objective& o) {
  if (o.kind == "max-seqlen" && a.seqlen != b.seqlen) return a.seqlen > b.seqlen;
  if (tokens_per_s(a) != tokens_per_s(b)) return tokens_per_s(a) > tokens_per_s(b);
  return a.id < b.id;
}

std::vector<const store::TrialRecord*> rank_trials(const std::vector<store::TrialRecord>& trials,
                                                   const Objective& o) {
  std::vector<const store::TrialRecord*> out;
  for (const store::TrialRecord& t : trials) {
    if (!qualifies(t, o)) continue;
    if (o.kind == "throughput" && t.seqlen != o.target_length) continue;
    out.push_back(&t);
  }
  std::sort(out.begin(), out.end(), [&](const store::TrialRecord* a, const store::TrialRecord* b) {
    return ranks_before(*a, *b, o);
  });
  return out;
}

}  // namespace ulysses::report
