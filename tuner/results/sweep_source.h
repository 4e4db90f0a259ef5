// Reading sweeps for report, list and show: the results database opened read-only (never
// created), a sweep found by name or the latest, and its trials with their phases in memory.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tuner/store/database.h"
#include "tuner/store/trial_record.h"

namespace ulysses::report {

// Opens `db_path` read-only. Throws UserError "<db_path>: no such file" when it does not exist
// (nothing is created), naming the file when it is not an SQLite database, and when its schema
// is newer than this build.
store::Database open_results(const std::string& db_path);

// True when the database has the sweep tables (schema version >= 2); older stores hold none.
bool has_sweep_tables(store::Database& db);

// The sweep named `name`, or the newest sweep when `name` is "". Throws UserError
// "--sweep NAME: no such sweep in DB (has: a, b)" or "DB: holds no sweeps".
store::SweepRecord find_sweep(store::Database& db, const std::string& name);

// A sweep with all its trials (id order), each trial's phases and the machine's load while
// trials ran.
struct SweepData {
  store::SweepRecord sweep;
  std::vector<store::TrialRecord> trials;
  std::map<int64_t, std::vector<store::TrialPhase>> phases;  // by trial id; absent = none
  std::vector<store::TrialLoad> loads;  // trial id order; empty when none was recorded
  // The trials each trial ran beside (trial_neighbours), by trial id; absent = ran alone.
  std::map<int64_t, std::vector<int64_t>> neighbours;
  // Whether the trials' step-time predictions (predicted_step_ms) came from a cost-model fit
  // (time_predictions_calibrated); false: from the hardware profile's peaks, uncalibrated.
  bool time_calibrated = false;
};
// Whether the sweep's step-time predictions came from a cost-model fit (`plan --fit`). A sweep
// loads the newest fit in its database when it starts (results/calibrated_model.h load_model),
// else predicts from the hardware profile's peaks, and stores no mark of which: it used a fit
// when one was stored no later than the sweep was created. A fit stored after that, which a
// resumed sweep would use for the trials it runs next, does not count (those are called
// uncalibrated too).
bool time_predictions_calibrated(store::Database& db, const store::SweepRecord& sweep);

// find_sweep() and everything stored under it. Throws as find_sweep().
SweepData load_sweep(store::Database& db, const std::string& name);

}  // namespace ulysses::report
