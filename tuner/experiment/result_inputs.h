// What of an experiment a sweep was started with, so that `sweep --resume` can refuse an
// experiment that changed since the sweep started (stored results would be replayed as facts
// about a different configuration). Only the budget's max_trials and wall_clock_s, the name,
// the description and the runner (how ranks are started) may change: they are not part of it.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "tuner/experiment/experiment.h"

namespace ulysses::experiment {

// One input as (experiment key, canonical text of its resolved value).
struct ResultInput {
  std::string key;
  std::string value;
};

// In a fixed order: world_size, nodes, device, memory_limit_gib, headroom, then every key of the
// resolved base run config (model preset or HF config included, every default written) as
// "base.<section>.<key>" with its value on one line ("base.train.steps" = "3"; the keys every
// trial sets itself too), space (the axis keys in order), space.<key> per axis,
// space.sequence.length, objective, target_length, budget.trial_timeout_s, trial.warmup_steps,
// trial.steps, search.method.
// REQUIRES: `e` from load_experiment / parse_experiment.
std::vector<ResultInput> result_inputs(const Experiment& e);

// The key of the first input whose value differs between `before` and `now` (or that only one
// of them has), or "" when they agree.
std::string first_difference(const std::vector<ResultInput>& before,
                             const std::vector<ResultInput>& now);

// What the experiment's text does not hold but its trials depend on, as digests to store with
// a sweep: "hardware_profile" (the profile file's keys and values but name and description;
// comments and layout ignored), "model" (the model section of the resolved base run config,
// i.e. the contents of a model preset or an HF config.json) and, when base.data.source names
// files, "data" (training_data.h). Digests are digest_of's.
// Throws UserError when the profile, the base run config or the data cannot be read.
std::map<std::string, std::string> profile_digests(const Experiment& e);

// "fnv1a64:" + 16 hex digits: a stable digest (the same on every build), not a cryptographic one.
std::string digest_of(const std::string& text);

}  // namespace ulysses::experiment
