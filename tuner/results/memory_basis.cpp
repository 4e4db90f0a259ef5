// Peak memory above the start-up baseline (see memory_basis.h).
#include "tuner/results/memory_basis.h"

#include <algorithm>
#include <exception>
#include <nlohmann/json.hpp>

#include "config/run_config.h"
#include "tuner/costmodel/memory_model.h"
#include "tuner/results/format.h"
#include "tuner/results/sweep_analysis.h"

namespace ulysses::report {

std::string trial_device(const store::TrialRecord& trial) {
  const auto summary = nlohmann::json::parse(trial.summary, nullptr, /*allow_exceptions=*/false);
  if (summary.is_object() && summary.contains("device") && summary["device"].is_string()) {
    return summary["device"].get<std::string>().rfind("cuda", 0) == 0 ? "cuda" : "cpu";
  }
  if (trial.config_yaml.empty()) return "cpu";
  try {
    return config::parse_run_config_yaml(trial.config_yaml).train.device;
  } catch (const std::exception&) {
    return "cpu";  // a run config this build cannot read: the default device
  }
}

int64_t memory_baseline_bytes(const std::string& device) {
  return static_cast<int64_t>(costmodel::default_memory_coefficients(device).runtime_bytes);
}

std::optional<int64_t> recorded_baseline_bytes(const store::TrialRecord& trial) {
  const auto summary = nlohmann::json::parse(trial.summary, nullptr, /*allow_exceptions=*/false);
  if (summary.is_object() && summary.contains("memory_baseline_bytes") &&
      summary["memory_baseline_bytes"].is_number_integer()) {
    return summary["memory_baseline_bytes"].get<int64_t>();
  }
  return std::nullopt;
}

int64_t trial_baseline_bytes(const store::TrialRecord& trial) {
  if (const std::optional<int64_t> recorded = recorded_baseline_bytes(trial)) return *recorded;
  return memory_baseline_bytes(trial_device(trial));
}

bool baseline_estimated(const store::TrialRecord& trial) {
  return !recorded_baseline_bytes(trial) && trial_device(trial) != "cuda";
}

std::optional<int64_t> above_baseline(const store::TrialRecord& trial,
                                      std::optional<int64_t> bytes) {
  if (!bytes) return std::nullopt;
  return std::max<int64_t>(0, *bytes - trial_baseline_bytes(trial));
}

std::optional<int64_t> peak_above_baseline(const store::TrialRecord& trial) {
  return above_baseline(trial, trial.peak_mem_bytes);
}

std::string trial_basis(const store::TrialRecord& trial) {
  if (trial_device(trial) == "cuda" && trial_baseline_bytes(trial) == 0) {
    return "above the start-up baseline (CUDA: device footprint, baseline 0)";
  }
  return "above the start-up baseline " + memory_size(trial_baseline_bytes(trial)) +
         (baseline_estimated(trial) ? " (estimated)" : "");
}

namespace {

// Whether trials with a peak or a predicted peak ran on CPU and on CUDA, and how many CPU trials
// did not record their baseline.
struct Devices {
  bool cpu = false, cuda = false;
  int64_t cpu_estimated = 0;
};
Devices devices_of(const std::vector<store::TrialRecord>& trials) {
  Devices d;
  for (const store::TrialRecord& t : trials) {
    if (!t.peak_mem_bytes && !t.predicted_peak_bytes) continue;
    (trial_device(t) == "cuda" ? d.cuda : d.cpu) = true;
    d.cpu_estimated += baseline_estimated(t);
  }
  return d;
}

}  // namespace

std::string memory_basis_note(const std::vector<store::TrialRecord>& trials) {
  const Devices d = devices_of(trials);
  std::string note =
      "Peak memory is per rank and above the rank's start-up baseline, the part that "
      "memory.limit_gib caps; limits are per rank too.";
  if (d.cpu) {
    note += " On CPU it is the peak resident set minus the rank's resident set before it built "
            "its model (LibTorch, Gloo, the OpenMP pool), as each trial measured and recorded it "
            "(summary.json memory_baseline_bytes).";
    if (d.cpu_estimated > 0) {
      note += ' ';
      note += std::to_string(d.cpu_estimated) +
              (d.cpu_estimated == 1 ? " trial" : " trials") +
              " from a ulysses-train that did not record it use the cost model's estimate "
              "instead (its runtime term), a baseline of " +
              memory_size(memory_baseline_bytes("cpu")) + ".";
    }
    note += " There the limit caps address space above the baseline and the kernel enforces "
            "it: a trial that ran to the end fit.";
  }
  const bool deepspeed = std::any_of(trials.begin(), trials.end(), [](const store::TrialRecord& t) {
    return trial_backend(t) == "deepspeed";
  });
  if (deepspeed) {
    note += " Trials of the deepspeed backend record their own baseline: the resident set of "
            "the rank's Python process before it builds the model.";
  }
  if (d.cuda) {
    note += " On CUDA it is the rank's device footprint at its peak: the caching allocator's "
            "reserved peak (cached and fragmented blocks included) plus the memory outside the "
            "allocator (CUDA context, NCCL buffers) as the driver reports it; nothing is "
            "subtracted (baseline 0), so a trial that fits leaves that much of a device of the "
            "limit's size in use.";
  }
  return note;
}

std::string memory_basis_caption(const std::vector<store::TrialRecord>& trials) {
  const Devices d = devices_of(trials);
  std::string caption = "peak above the start-up baseline";
  if (d.cpu) {
    std::string cpu = "resident peak minus the measured baseline";
    if (d.cpu_estimated > 0) {
      cpu = "resident peak minus " + memory_size(memory_baseline_bytes("cpu")) + ", estimated";
    }
    caption += std::string(d.cuda ? " (CPU: " : " (") + cpu;
    caption += d.cuda ? "; CUDA: device footprint)" : ")";
  } else if (d.cuda) {
    caption += " (CUDA: reserved peak + context and NCCL)";
  }
  return caption;
}

}  // namespace ulysses::report
