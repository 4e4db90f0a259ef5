// Ours against DeepSpeed in one sweep: the trials of the native and the deepspeed backend paired
// by configuration (every other axis equal) and sequence length, with the ratios the report
// shows side by side. Pure functions over the store's records.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tuner/store/trial_record.h"

namespace ulysses::report {

// One configuration at one length, as each backend ran it (nullptr: that backend has no
// trial there that is not a memory probe).
struct BackendPair {
  std::string configuration;  // configuration(trial, "backend")
  int64_t seqlen = 0;
  const store::TrialRecord* native = nullptr;
  const store::TrialRecord* deepspeed = nullptr;
  // deepspeed / native when both were measured (report::is_measured); else unset.
  std::optional<double> throughput_ratio;
  // deepspeed / native peak memory above each backend's own start-up baseline, when both
  // recorded a peak and ran to the end.
  std::optional<double> peak_ratio;
  // |deepspeed - native| of the first and the final step's loss, when both recorded them (the
  // same weights and tokens give the same losses up to rounding).
  std::optional<double> first_loss_difference, final_loss_difference;
};

// The pairs of a sweep with both backends, in the order of the native trials (then deepspeed
// trials without a native partner); a configuration and length that only one backend ran is
// listed with the other side nullptr. Empty when the trials are of one backend only.
std::vector<BackendPair> backend_pairs(const std::vector<store::TrialRecord>& trials);

// The summary's first_loss of the trial, when it has one.
std::optional<double> first_loss(const store::TrialRecord& trial);

// The DeepSpeed workarounds the trial's rank program applied (summary.json "workarounds"), one
// line each; empty for a native trial.
std::vector<std::string> workarounds(const store::TrialRecord& trial);

}  // namespace ulysses::report
