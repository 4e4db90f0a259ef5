// What rank 0 of a trial wrote (src/train/metrics.cpp): summary.json and metrics.jsonl, read into
// the store's measurement fields, per-step rows and per-phase rows (store/trial_record.h).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tuner/store/trial_record.h"

namespace ulysses::trial {

// The names of the category totals among the phases, in the order they are listed.
inline constexpr const char* kCategoryPhases[] = {"compute_ms", "comm_ms", "offload_ms",
                                                  "optimizer_ms", "comm_wait_ms"};

struct Measurements {
  bool summary_found = false;  // summary.json existed and held a JSON object
  // From summary.json; the step medians only when it measured at least one step. Without a
  // summary, peak_mem_bytes / peak_host_bytes are the maxima over the steps of metrics.jsonl.
  std::optional<double> step_ms;                // step_ms_median
  std::optional<double> tokens_per_s;           // tokens_per_s_median (whole job)
  std::optional<double> tokens_per_s_per_rank;  // tokens_per_s_per_rank_median
  std::optional<double> final_loss;             // final_loss
  std::optional<int64_t> peak_mem_bytes;        // peak_mem_bytes (rank 0's)
  std::optional<int64_t> peak_host_bytes;       // peak_host_bytes (rank 0's)
  std::string summary_json = "{}";              // summary.json, compact; "{}" without one
  std::vector<store::TrialStep> steps;          // metrics.jsonl step lines, in file order
  // summary.json's phases_ms_median (by name), then the category medians named as in
  // kCategoryPhases (those the summary has). Empty without a summary.
  std::vector<store::TrialPhase> phases;
  // Why a file was not read, one line: summary.json or metrics.jsonl over kMaxInputFileBytes
  // ("<path>: 17.0 MiB is over the 16 MiB limit of a JSON file"); empty when none was refused.
  std::string error;
};

// Reads <output_dir>/summary.json and <output_dir>/metrics.jsonl. Missing or unreadable files
// give empty measurements, and so does a file over kMaxInputFileBytes (common/input_file.h), whose
// one-line reason goes to Measurements::error; lines of metrics.jsonl that do not parse (a run
// killed mid-write), evaluation lines ({"eval": ...}) and lines without a "step" are skipped; a
// missing numeric field reads as 0 in a step and as nullopt in the summary fields. Never throws
// for bad content.
Measurements read_measurements(const std::string& output_dir);

}  // namespace ulysses::trial
