// The numerics check of `ulysses-tune recommend`: before a configuration is recommended, a short
// run of it and a run of the same model on one rank (sp 1, dp 1, no ring, no uneven heads, no
// ZeRO sharding; the same global batch: grad_accum x dp; the same seed, data and memory features)
// must agree per step in loss, grad norm and held-out eval loss within a relative tolerance. A
// mesh that computes, or reports, something else than the plain model (an eval loss scaled by
// the sp size, an sp setting ignored) fails it and is not recommended.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tuner/store/trial_record.h"

namespace ulysses::recommend {

// One step of one run: its loss and grad norm (metrics.jsonl step record) and the eval loss
// after it (the evaluation record of that step).
struct CheckStep {
  int64_t step = 0;
  std::optional<double> loss, grad_norm, eval_loss;
};

// Relative tolerance on every compared metric: fp32 1e-4, bf16 2e-2 (numerics_tolerance).
double numerics_tolerance(const std::string& precision);

struct NumericsCheck {
  // passed | failed | not_run (the check could not run: the reason says why) | skipped (--no-check)
  std::string status;
  std::string reason;  // one line; for failed the metric, the step and by how much
  int64_t trial_id = 0;
  std::string configuration;  // report::configuration of the trial
  std::string precision;      // memory.precision of the runs
  double tolerance = 0.0;     // relative
  int64_t steps = 0;
  int candidate_ranks = 0;
  std::string candidate_command, reference_command;  // as a user re-runs them
  std::string candidate_yaml, reference_yaml;        // the two run configs (outputs aside)
  std::vector<CheckStep> candidate, reference;
  double worst = 0.0;         // the worst relative difference of any metric and step
  std::string worst_metric;   // loss | grad_norm | eval_loss | "" (nothing compared)
  int64_t worst_step = 0;
  nlohmann::ordered_json to_json() const;
};

struct CheckOptions {
  std::string trainer;   // ulysses-train
  std::string work_dir;  // the two runs go to work_dir/trial-<id>-{candidate,reference}
  int64_t steps = 3;     // training steps of each run, an evaluation after each
  int64_t eval_batches = 2;  // eval batches of the candidate per evaluation (reference: x dp)
  double timeout_s = 600;    // per run
};

// Both run configs of the check for trial `t` (its stored config_yaml): the candidate as the
// trial ran it, the reference on one rank; output.dir of each is `candidate_dir` /
// `reference_dir`. Throws UserError when the stored config does not parse.
struct CheckConfigs {
  std::string candidate_yaml, reference_yaml;
  int candidate_ranks = 1;
  std::string precision;
};
CheckConfigs check_configs(const store::TrialRecord& t, const CheckOptions& o,
                           const std::string& candidate_dir, const std::string& reference_dir);

// Runs both (the sweep's local trial runner) and compares them. A candidate that fails to run,
// or disagrees, is `failed`; a reference that fails to run leaves the check `not_run`. A trial
// already on one rank is its own reference: `passed` without runs, the reason says so.
// Called as trial::run_trial requires (the main thread).
NumericsCheck check_numerics(const store::TrialRecord& t, const CheckOptions& o);

// The "Numerics check" section of WHY.md for `checks` (the last one decided; earlier ones
// failed).
std::string render_numerics_section(const std::vector<NumericsCheck>& checks);

}  // namespace ulysses::recommend
