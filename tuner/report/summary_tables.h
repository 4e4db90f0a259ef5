// The sweep's environment and search summary (sweeps.environment / sweeps.summary JSON) as
// key-value tables, for the report and `ulysses-tune show`.
#pragma once
#include <string>
#include <vector>

#include "tuner/results/sweep_source.h"
#include "tuner/results/table.h"

namespace ulysses::report {

// The sweeps.environment or sweeps.summary JSON as (key, value) rows: nested objects flattened
// to dotted keys ("devices.0.name" for arrays of objects), arrays of scalars joined with ", ".
// Text that is not a JSON object gives one row ("(not JSON)", text). `skip` names top-level keys
// left out.
Table json_table(const std::string& json_text, const std::vector<std::string>& skip = {});

// What the sweep's trials trained on, from its environment's "data" (one sentence, no period).
std::string data_sentence(const SweepData& data);

// The data manifest's document-length histogram (length range, documents); empty without one.
Table document_length_table(const SweepData& data);

// The search summary (sweeps.summary): the known counts first with readable names (trials_run,
// pruned, skipped, invalid, grid_trials), the best trial (the one rank_trials() puts first under
// the sweep's objective, objective.h; the one the sweep recorded when its experiment cannot be
// read), the fraction of the grid that ran, then any other key. grid_comparison is left out: see
// grid_comparison_table().
Table search_summary_table(const SweepData& data);
// summary.grid_comparison as a table; a table without rows when there is none.
Table grid_comparison_table(const SweepData& data);

// Ours against DeepSpeed (results/backend_comparison.h): one row per configuration and length
// that either backend ran, each side's trial and status, tokens/s per rank, peak above its own
// baseline, the deepspeed / native ratios and the loss differences; a table without rows when
// the sweep holds one backend only.
Table backends_table(const SweepData& data);

}  // namespace ulysses::report
