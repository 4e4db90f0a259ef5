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

std::optional<int64_t> capped_peak(const store::TrialRecord& trial) {
  if (trial_device(trial) == "cuda") return peak_above_baseline(trial);
  const auto summary = nlohmann::json::parse(trial.summary, nullptr, /*allow_exceptions=*/false);
  if (summary.is_object() && summary.contains("max_rank_peak_address_space_bytes") &&
      summary["max_rank_peak_address_space_bytes"].is_number_integer()) {
    return summary["max_rank_peak_address_space_bytes"].get<int64_t>();
  }
  return std::nullopt;
}

std::string trial_basis(const store::TrialRecord& trial) {
  if (trial_device(trial) == "cuda" && trial_baseline_bytes(trial) == 0) {
    return "above the start-up baseline (CUDA: device footprint, baseline 0)";
  }
  return "above the start-up baseline " + memory_size(trial_baseline_bytes(trial)) +
         (baseline_estimated(trial) ? " (estimated)" : "");
}

namespace {

// Whether trials with a peak or a predicted peak ran on CPU and on CUDA; of the CPU trials, those
// whose baseline is the estimate, by why they recorded none, and the ok ones that recorded no
// address space.
struct Devices {
  bool cpu = false, cuda = false;
  int64_t older_trainer = 0;   // ok, no baseline in summary.json: an older ulysses-train
  int64_t ended_early = 0;     // ran, not ok: no summary.json
  int64_t not_run = 0;         // never ran: a predicted peak only (pruned, skipped)
  int64_t no_address_space = 0;  // ok CPU trials without max_rank_peak_address_space_bytes
  int64_t measured = 0;          // CPU trials with a recorded baseline
  int64_t estimated() const { return older_trainer + ended_early + not_run; }
};
Devices devices_of(const std::vector<store::TrialRecord>& trials) {
  Devices d;
  for (const store::TrialRecord& t : trials) {
    if (!t.peak_mem_bytes && !t.predicted_peak_bytes) continue;
    (trial_device(t) == "cuda" ? d.cuda : d.cpu) = true;
    if (trial_device(t) == "cuda") continue;
    if (t.status == "ok" && t.peak_mem_bytes && !capped_peak(t)) ++d.no_address_space;
    if (!baseline_estimated(t)) {
      ++d.measured;
      continue;
    }
    if (t.status == "pruned" || t.status == "skipped" || t.status == "invalid") {
      ++d.not_run;
    } else if (t.status == "ok") {
      ++d.older_trainer;
    } else {
      ++d.ended_early;
    }
  }
  return d;
}

std::string trials_text(int64_t n) { return std::to_string(n) + (n == 1 ? " trial" : " trials"); }

}  // namespace

bool limit_caps_address_space(const std::vector<store::TrialRecord>& trials) {
  return devices_of(trials).cpu &&
         std::any_of(trials.begin(), trials.end(), [](const store::TrialRecord& t) {
           return trial_device(t) != "cuda" && t.limit_bytes && *t.limit_bytes > 0;
         });
}

std::string peak_label(const std::vector<store::TrialRecord>& trials) {
  const Devices d = devices_of(trials);
  return d.cpu && !d.cuda ? "RSS above baseline" : "peak above baseline";
}

std::string capped_label(const std::vector<store::TrialRecord>& trials) {
  const Devices d = devices_of(trials);
  return d.cpu && !d.cuda ? "address space above baseline" : "capped peak above baseline";
}

std::string peak_against_limit(const store::TrialRecord& t) {
  const std::string limit =
      t.limit_bytes && *t.limit_bytes > 0 ? "a per-rank limit of " + memory_size(t.limit_bytes)
                                          : std::string();
  if (trial_device(t) == "cuda") {
    return "peak " + memory_size(peak_above_baseline(t)) + (limit.empty() ? "" : " of " + limit);
  }
  const std::string rss = "RSS " + memory_size(peak_above_baseline(t)) + " above its start-up RSS";
  if (limit.empty()) return rss;
  if (const std::optional<int64_t> capped = capped_peak(t)) {
    return "address space " + memory_size(capped) + " (above its start-up size) of " + limit +
           " (" + rss + ")";
  }
  return rss + "; the " + limit.substr(2) + " caps address space, which it did not record";
}

std::string memory_basis_note(const std::vector<store::TrialRecord>& trials) {
  const Devices d = devices_of(trials);
  std::string note =
      "Peak memory is per rank and above the rank's start-up baseline; limits are per rank too.";
  if (d.cpu) {
    note += " On CPU the peak is the resident set (RSS) minus the rank's resident set before it "
            "built its model (LibTorch, Gloo, the OpenMP pool), as each trial measured and "
            "recorded it (summary.json memory_baseline_bytes).";
    if (d.estimated() > 0) {
      std::vector<std::string> parts;
      if (d.older_trainer > 0) {
        parts.push_back(trials_text(d.older_trainer) +
                        " from an older ulysses-train that did not record it");
      }
      if (d.ended_early > 0) {
        parts.push_back(trials_text(d.ended_early) +
                        " that stopped before writing summary.json (out of memory, failed, "
                        "killed or timed out)");
      }
      if (d.not_run > 0) {
        parts.push_back("the predicted peaks of " + trials_text(d.not_run) +
                        " that did not run (pruned or skipped)");
      }
      std::string list;
      for (size_t i = 0; i < parts.size(); ++i) {
        list += (i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ") + parts[i];
      }
      note += " For " + list + ", the cost model's estimate (its runtime term), a baseline of " +
              memory_size(memory_baseline_bytes("cpu")) + ", stands in.";
    }
    note += " memory.limit_gib does not cap that RSS: on CPU it caps the address space above the "
            "rank's start-up address space (RLIMIT_AS), and the kernel enforces it, so a trial "
            "that ran to the end stayed within it. That address space (summary.json "
            "max_rank_peak_address_space_bytes) is what is compared with the limit. The RSS "
            "above the baseline can exceed the limit: memory reserved before the baseline "
            "(thread stacks, malloc arenas) becomes resident without growing the address space.";
    if (d.no_address_space > 0) {
      note += ' ';
      note += trials_text(d.no_address_space) +
              " that ran to the end recorded no address space (an older ulysses-train): there "
              "the limit is not compared with anything.";
    }
  }
  const bool deepspeed = std::any_of(trials.begin(), trials.end(), [](const store::TrialRecord& t) {
    return trial_backend(t) == "deepspeed";
  });
  if (deepspeed) {
    note += " Trials of the deepspeed backend record their own baseline: the resident set of "
            "the rank's Python process before it builds the model.";
  }
  if (d.cuda) {
    note += " On CUDA the peak is the rank's device footprint at its peak, what memory.limit_gib "
            "caps there: the caching allocator's reserved peak (cached and fragmented blocks "
            "included) plus the memory outside the allocator (CUDA context, NCCL buffers) as the "
            "driver reports it; nothing is subtracted (baseline 0), so a trial that fits leaves "
            "that much of a device of the limit's size in use.";
  }
  return note;
}

std::string memory_basis_caption(const std::vector<store::TrialRecord>& trials) {
  const Devices d = devices_of(trials);
  std::string caption = "peak above the start-up baseline";
  if (d.cpu) {
    std::string cpu = "RSS minus the measured baseline";
    if (d.estimated() > 0) {
      const std::string estimate = memory_size(memory_baseline_bytes("cpu")) + ", estimated";
      cpu = d.measured > 0 ? cpu + "; " + estimate + ", where none was recorded"
                           : "RSS minus " + estimate;
    }
    caption += std::string(d.cuda ? " (CPU: " : " (") + cpu;
    caption += d.cuda ? "; CUDA: device footprint)" : ")";
  } else if (d.cuda) {
    caption += " (CUDA: reserved peak + context and NCCL)";
  }
  return caption;
}

}  // namespace ulysses::report
