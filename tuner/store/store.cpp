// Calibration and profile records in the results database (see store.h).
#include "tuner/store/store.h"

#include "tuner/store/migrations.h"

namespace ulysses::store {

Store Store::open(const std::string& path) {
  Database db = Database::open(path);
  migrate(db);
  return Store(std::move(db));
}

int64_t Store::insert_calibration_run(const CalibrationRun& run,
                                      const std::vector<Calibration>& rows) {
  db_.prepare(
         "INSERT INTO calibration_runs (hardware, host, device, world_size, command) "
         "VALUES (?, ?, ?, ?, ?)")
      .bind(1, run.hardware)
      .bind(2, run.host)
      .bind(3, run.device)
      .bind(4, run.world_size)
      .bind(5, run.command)
      .run();
  const int64_t run_id = db_.last_insert_rowid();
  for (const Calibration& row : rows) {
    Statement s = db_.prepare(
        "INSERT INTO calibrations (run_id, benchmark, metric, value, unit, params) "
        "VALUES (?, ?, ?, ?, ?, ?)");
    s.bind(1, run_id).bind(2, row.benchmark).bind(3, row.metric).bind(4, row.value);
    s.bind(5, row.unit).bind(6, row.params).run();
  }
  return run_id;
}

int64_t Store::add_calibration_run(const CalibrationRun& run,
                                   const std::vector<Calibration>& rows) {
  int64_t run_id = 0;
  db_.transaction([&] { run_id = insert_calibration_run(run, rows); });
  return run_id;
}

int64_t Store::add_model_fit(const CalibrationRun& run,
                             const std::vector<Calibration>& coefficients,
                             const std::vector<FitTrial>& trials) {
  int64_t run_id = 0;
  db_.transaction([&] {
    run_id = insert_calibration_run(run, coefficients);
    for (const FitTrial& t : trials) {
      db_.prepare(
             "INSERT INTO calibration_trials (run_id, trial_id, kind, measured, predicted) "
             "VALUES (?, ?, ?, ?, ?)")
          .bind(1, run_id)
          .bind(2, t.trial_id)
          .bind(3, t.kind)
          .bind(4, t.measured)
          .bind(5, t.predicted)
          .run();
    }
  });
  return run_id;
}

std::optional<CalibrationRun> latest_model_fit(Database& db, const std::string& device) {
  Statement s = db.prepare(
      "SELECT MAX(r.id) FROM calibration_runs r JOIN calibrations c ON c.run_id = r.id "
      "WHERE c.benchmark = ? AND (? = '' OR r.device = ?)");
  s.bind(1, std::string(kCostModelFitBenchmark)).bind(2, device).bind(3, device);
  if (!s.step() || s.is_null(0)) return std::nullopt;
  const int64_t id = s.column_int(0);
  for (CalibrationRun& run : read_calibration_runs(db)) {
    if (run.id == id) return run;
  }
  return std::nullopt;
}

std::vector<FitTrial> Store::fit_trials(int64_t run_id) {
  Statement s = db_.prepare(
      "SELECT trial_id, kind, measured, predicted FROM calibration_trials WHERE run_id = ? "
      "ORDER BY trial_id, kind");
  s.bind(1, run_id);
  std::vector<FitTrial> out;
  while (s.step()) {
    out.push_back({s.column_int(0), s.column_text(1), s.column_double(2), s.column_double(3)});
  }
  return out;
}

std::vector<CalibrationRun> read_calibration_runs(Database& db) {
  Statement s = db.prepare(
      "SELECT id, created_at, hardware, host, device, world_size, command FROM calibration_runs "
      "ORDER BY id");
  std::vector<CalibrationRun> out;
  while (s.step()) {
    CalibrationRun run;
    run.id = s.column_int(0);
    run.created_at = s.column_text(1);
    run.hardware = s.column_text(2);
    run.host = s.column_text(3);
    run.device = s.column_text(4);
    run.world_size = s.column_int(5);
    run.command = s.column_text(6);
    out.push_back(std::move(run));
  }
  return out;
}

std::vector<Calibration> read_calibrations(Database& db, int64_t run_id) {
  Statement s = db.prepare(
      "SELECT run_id, benchmark, metric, value, unit, params FROM calibrations WHERE run_id = ? "
      "ORDER BY id");
  s.bind(1, run_id);
  std::vector<Calibration> out;
  while (s.step()) {
    Calibration row;
    row.run_id = s.column_int(0);
    row.benchmark = s.column_text(1);
    row.metric = s.column_text(2);
    row.value = s.column_double(3);
    row.unit = s.column_text(4);
    row.params = s.column_text(5);
    out.push_back(std::move(row));
  }
  return out;
}

int64_t Store::add_profile(const ProfileRecord& r) {
  int64_t id = 0;
  db_.transaction([&] {
    Statement s = db_.prepare(
        "INSERT INTO profiles (trial_id, config_path, config_yaml, report_path, sqlite_path, "
        "devices, steps, window_ms, kernel_ms, comm_ms, compute_ms, overlap_ms, exposed_comm_ms, "
        "comm_kernels, compute_kernels, details) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    if (r.trial_id) {
      s.bind(1, *r.trial_id);
    } else {
      s.bind_null(1);
    }
    s.bind(2, r.config_path).bind(3, r.config_yaml).bind(4, r.report_path).bind(5, r.sqlite_path);
    s.bind(6, r.devices).bind(7, r.steps).bind(8, r.window_ms).bind(9, r.kernel_ms);
    s.bind(10, r.comm_ms).bind(11, r.compute_ms).bind(12, r.overlap_ms);
    s.bind(13, r.exposed_comm_ms).bind(14, r.comm_kernels).bind(15, r.compute_kernels);
    s.bind(16, r.details).run();
    id = db_.last_insert_rowid();
  });
  return id;
}

std::vector<ProfileRecord> Store::profiles() {
  Statement s = db_.prepare(
      "SELECT id, created_at, trial_id, config_path, config_yaml, report_path, sqlite_path, "
      "devices, steps, window_ms, kernel_ms, comm_ms, compute_ms, overlap_ms, exposed_comm_ms, "
      "comm_kernels, compute_kernels, details FROM profiles ORDER BY id");
  std::vector<ProfileRecord> out;
  while (s.step()) {
    ProfileRecord r;
    r.id = s.column_int(0);
    r.created_at = s.column_text(1);
    if (!s.is_null(2)) r.trial_id = s.column_int(2);
    r.config_path = s.column_text(3);
    r.config_yaml = s.column_text(4);
    r.report_path = s.column_text(5);
    r.sqlite_path = s.column_text(6);
    r.devices = s.column_int(7);
    r.steps = s.column_int(8);
    r.window_ms = s.column_double(9);
    r.kernel_ms = s.column_double(10);
    r.comm_ms = s.column_double(11);
    r.compute_ms = s.column_double(12);
    r.overlap_ms = s.column_double(13);
    r.exposed_comm_ms = s.column_double(14);
    r.comm_kernels = s.column_int(15);
    r.compute_kernels = s.column_int(16);
    r.details = s.column_text(17);
    out.push_back(std::move(r));
  }
  return out;
}

std::optional<std::string> Store::trial_config_yaml(int64_t trial_id) {
  if (!db_.has_table("trials") || !db_.has_column("trials", "config_yaml")) return std::nullopt;
  Statement s = db_.prepare("SELECT config_yaml FROM trials WHERE id = ?");
  s.bind(1, trial_id);
  if (!s.step()) return std::nullopt;
  return s.column_text(0);
}

}  // namespace ulysses::store
