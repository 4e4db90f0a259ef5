// Read-only access to sweeps (see sweep_source.h).
#include "tuner/results/sweep_source.h"

#include "common/error.h"
#include "tuner/store/migrations.h"
#include "tuner/store/store.h"
#include "tuner/store/sweep_store.h"

namespace ulysses::report {

store::Database open_results(const std::string& db_path) {
  store::Database db = store::Database::open(db_path, store::Database::Mode::kReadOnly);
  const int version = db.user_version();
  if (version > store::latest_schema_version()) {
    throw UserError(db_path + ": schema version " + std::to_string(version) +
                    " is newer than this ulysses-tune (" +
                    std::to_string(store::latest_schema_version()) + "); use a newer build");
  }
  return db;
}

bool has_sweep_tables(store::Database& db) {
  return db.user_version() >= 2 && db.has_table("sweeps") && db.has_table("trials");
}

store::SweepRecord find_sweep(store::Database& db, const std::string& name) {
  if (!has_sweep_tables(db)) throw UserError(db.path() + ": holds no sweeps");
  store::SweepStore sweeps(db);
  if (name.empty()) {
    if (auto latest = sweeps.latest_sweep()) return *latest;
    throw UserError(db.path() + ": holds no sweeps");
  }
  if (auto found = sweeps.find_sweep(name)) return *found;
  std::string names;
  for (const auto& sweep : sweeps.sweeps()) names += (names.empty() ? "" : ", ") + sweep.name;
  throw UserError("--sweep " + name + ": no such sweep in " + db.path() +
                  (names.empty() ? " (it holds none)" : " (has: " + names + ")"));
}

bool time_predictions_calibrated(store::Database& db, const store::SweepRecord& sweep) {
  if (!db.has_table("calibration_runs") || !db.has_table("calibrations")) return false;
  for (const store::CalibrationRun& run : store::read_calibration_runs(db)) {
    if (run.created_at > sweep.created_at) continue;  // ISO 8601 UTC: text order is time order
    for (const store::Calibration& row : store::read_calibrations(db, run.id)) {
      if (row.benchmark == store::kCostModelFitBenchmark) return true;
    }
  }
  return false;
}

SweepData load_sweep(store::Database& db, const std::string& name) {
  SweepData data;
  data.sweep = find_sweep(db, name);
  store::SweepStore sweeps(db);
  data.trials = sweeps.trials(data.sweep.id);
  data.loads = sweeps.trial_loads(data.sweep.id);
  for (const store::TrialNeighbour& n : sweeps.trial_neighbours(data.sweep.id)) {
    data.neighbours[n.trial_id].push_back(n.neighbour_id);
  }
  data.time_calibrated = time_predictions_calibrated(db, data.sweep);
  for (const auto& trial : data.trials) {
    auto phases = sweeps.trial_phases(trial.id);
    if (!phases.empty()) data.phases[trial.id] = std::move(phases);
  }
  return data;
}

}  // namespace ulysses::report
