// The sweep's tables, built from the store's records (one result schema, several printers:
// table.h renders them for the terminal, markdown and CSV).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "tuner/results/table.h"
#include "tuner/store/trial_record.h"

namespace ulysses::report {

// Every column of a TrialRecord as (name, text), in the order and with the names of the store's
// `trials` table; exact values (format.h exact()), "" for unset optionals, probe as 0/1.
std::vector<std::pair<std::string, std::string>> trial_fields(const store::TrialRecord& trial);

// All of trial_fields() for each trial: the rows of trials.csv.
Table trial_fields_table(const std::vector<store::TrialRecord>& trials);

// One row per trial, for people: id, status ("ok (probe)" for probes), mesh (format.h mesh(),
// split included), seqlen, one column per axis of the space (sweep_analysis.h), tokens/s per
// rank, step ms, peak above the start-up baseline (memory_basis.h peak_label: RSS on CPU), when
// some trial ran on CPU the address space above its start-up size (capped_peak: what the limit
// caps there), the limit (memory sizes as format.h memory_size writes them), and the error (or
// the reason a trial did not run).
Table trials_table(const std::vector<store::TrialRecord>& trials);

// One row per mesh (best_per_mesh()): trials, measured, the fastest trial (tokens/s per rank,
// seqlen, configuration, id) and the longest measured sequence with its throughput. Neither is
// "best": that is the sweep's objective's pick (objective.h).
Table best_per_mesh_table(const std::vector<store::TrialRecord>& trials);

// The cost model beside the measurement, one row per trial that ran to the end (status ok) and
// has a prediction: id, mesh, seqlen, probe, measured and predicted peak (memory_size, both above the
// start-up baseline: memory_basis.h) and the error, measured and predicted step ms and the error
// ("-" where either is missing). Error = (predicted - measured) / measured, signed percent.
// Unless `time_calibrated` (the predictions came from a cost-model fit, sweep_source.h), the
// predicted step time's column says "uncalibrated".
Table prediction_table(const std::vector<store::TrialRecord>& trials, bool time_calibrated);

// "ok 6, oom 1, pruned 2" (status_counts()), "none" for no trials.
std::string status_count_text(const std::vector<store::TrialRecord>& trials);

}  // namespace ulysses::report
