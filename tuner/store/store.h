// The tuner's results database: one SQLite file in WAL mode whose schema is
// brought to the latest version on open (migrations.h). This file holds the records of
// calibration (`ulysses-tune calibrate`) and of nsys profiles (`ulysses-tune profile`); the
// sweep adds its tables through new migrations and its own accessors.
//
// Every write is one transaction: a killed process leaves the database valid and holding
// either all of a record or none of it. Errors are UserError naming the file (database.h).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tuner/store/database.h"

namespace ulysses::store {

// One `ulysses-tune calibrate` run (table calibration_runs).
struct CalibrationRun {
  int64_t id = 0;          // set by the store
  std::string created_at;  // set by the store, UTC ISO 8601
  std::string hardware;    // hardware profile name
  std::string host;
  std::string device;  // cpu | cuda
  int64_t world_size = 1;
  std::string command;
};

// One measured figure of a calibration run (table calibrations).
struct Calibration {
  int64_t run_id = 0;  // set by the store
  std::string benchmark;
  std::string metric;  // time_ms | algbw_GBps | busbw_GBps | tflops | GBps
  double value = 0.0;
  std::string unit;
  std::string params = "{}";  // JSON object
};

// The benchmark name of a cost-model fit's coefficient rows (calibrations.benchmark).
inline constexpr const char* kCostModelFitBenchmark = "costmodel.fit";

// One trial a cost-model fit was fitted on (table calibration_trials).
struct FitTrial {
  int64_t trial_id = 0;
  std::string kind;  // memory | time
  double measured = 0.0, predicted = 0.0;
};

// Kernel-time split of one nsys profile (table profiles); times in ms, summed over devices.
struct ProfileRecord {
  int64_t id = 0;  // set by the store
  std::string created_at;
  std::optional<int64_t> trial_id;
  std::string config_path, config_yaml, report_path, sqlite_path;
  int64_t devices = 0;
  int64_t steps = 0;
  double window_ms = 0.0, kernel_ms = 0.0, comm_ms = 0.0, compute_ms = 0.0, overlap_ms = 0.0,
         exposed_comm_ms = 0.0;
  int64_t comm_kernels = 0, compute_kernels = 0;
  std::string details = "{}";  // JSON
};

// The calibration runs of `db`, oldest first, and the rows of one run in insertion order
// (the same as Store's, for code that borrows a Database).
std::vector<CalibrationRun> read_calibration_runs(Database& db);
std::vector<Calibration> read_calibrations(Database& db, int64_t run_id);
// The newest run holding kCostModelFitBenchmark rows, for `device` ("" = any), or nullopt.
std::optional<CalibrationRun> latest_model_fit(Database& db, const std::string& device);

class Store {
 public:
  // Opens or creates the store at `path` and applies missing migrations.
  // Throws UserError naming the file when it is not an SQLite database, is newer than this
  // build, or cannot be written.
  static Store open(const std::string& path);

  int schema_version() { return db_.user_version(); }
  Database& db() { return db_; }

  // Inserts the run and its rows in one transaction; returns the run id.
  int64_t add_calibration_run(const CalibrationRun& run, const std::vector<Calibration>& rows);
  // All calibration runs, oldest first.
  std::vector<CalibrationRun> calibration_runs() { return read_calibration_runs(db_); }
  // The rows of run `run_id`, in insertion order.
  std::vector<Calibration> calibrations(int64_t run_id) { return read_calibrations(db_, run_id); }

  // A cost-model fit: the run, its coefficients (benchmark kCostModelFitBenchmark) and the
  // trials it was fitted on, in one transaction; returns the run id. REQUIRES: the trials exist
  // in this store (foreign keys).
  int64_t add_model_fit(const CalibrationRun& run, const std::vector<Calibration>& coefficients,
                        const std::vector<FitTrial>& trials);
  std::optional<CalibrationRun> latest_model_fit(const std::string& device) {
    return store::latest_model_fit(db_, device);
  }
  // The trials run `run_id` was fitted on, by trial id then kind.
  std::vector<FitTrial> fit_trials(int64_t run_id);

  // Inserts a profile; returns its id.
  int64_t add_profile(const ProfileRecord& record);
  // All profiles, oldest first.
  std::vector<ProfileRecord> profiles();

  // The run config (YAML) of trial `trial_id`, or nullopt when the store has no trials table
  // yet (no sweep has written to it) or no such trial. Reads trials.config_yaml.
  std::optional<std::string> trial_config_yaml(int64_t trial_id);

 private:
  explicit Store(Database db) : db_(std::move(db)) {}
  // The inserts of add_calibration_run, inside the caller's transaction.
  int64_t insert_calibration_run(const CalibrationRun& run, const std::vector<Calibration>& rows);
  Database db_;
};

}  // namespace ulysses::store
