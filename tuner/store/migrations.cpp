// The schema, version by version (see migrations.h).
#include "tuner/store/migrations.h"

#include <string>

#include "common/error.h"

namespace ulysses::store {

const std::vector<Migration>& migrations() {
  static const std::vector<Migration> list = {
      {1, "calibration runs and their measurements; nsys profiles",
       R"sql(
CREATE TABLE calibration_runs (
  id          INTEGER PRIMARY KEY,
  created_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ', 'now')),
  hardware    TEXT NOT NULL,      -- hardware profile name (profiles/hardware/<name>.yaml)
  host        TEXT NOT NULL,
  device      TEXT NOT NULL,      -- cpu | cuda
  world_size  INTEGER NOT NULL,   -- ranks of ulysses-bench (all-to-all group size)
  command     TEXT NOT NULL       -- the ulysses-bench command line
);
CREATE TABLE calibrations (
  id          INTEGER PRIMARY KEY,
  run_id      INTEGER NOT NULL REFERENCES calibration_runs(id) ON DELETE CASCADE,
  benchmark   TEXT NOT NULL,      -- google-benchmark name, e.g. AllToAll/bytes:1048576/ranks:2
  metric      TEXT NOT NULL,      -- time_ms | algbw_GBps | busbw_GBps | tflops | GBps
  value       REAL NOT NULL,
  unit        TEXT NOT NULL,
  params      TEXT NOT NULL DEFAULT '{}'  -- JSON: the benchmark's arguments
);
CREATE INDEX calibrations_by_metric ON calibrations(metric, benchmark);
CREATE TABLE profiles (
  id               INTEGER PRIMARY KEY,
  created_at       TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ', 'now')),
  trial_id         INTEGER,         -- the profiled trial, NULL for --config runs
  config_path      TEXT NOT NULL DEFAULT '',
  config_yaml      TEXT NOT NULL DEFAULT '',
  report_path      TEXT NOT NULL DEFAULT '',  -- .nsys-rep
  sqlite_path      TEXT NOT NULL DEFAULT '',  -- nsys export --type sqlite
  devices          INTEGER NOT NULL,
  steps            INTEGER NOT NULL,          -- NVTX step ranges inside the window
  window_ms        REAL NOT NULL,   -- summed over devices: the analysed time span
  kernel_ms        REAL NOT NULL,   -- union of all kernels
  comm_ms          REAL NOT NULL,   -- union of NCCL kernels
  compute_ms       REAL NOT NULL,   -- union of the other kernels
  overlap_ms       REAL NOT NULL,   -- comm and compute at the same time
  exposed_comm_ms  REAL NOT NULL,   -- comm_ms - overlap_ms
  comm_kernels     INTEGER NOT NULL,
  compute_kernels  INTEGER NOT NULL,
  details          TEXT NOT NULL DEFAULT '{}'  -- JSON: the same figures per device
);
)sql"},
  };
  return list;
}

int latest_schema_version() { return migrations().back().version; }

int migrate(Database& db) {
  int applied = 0;
  for (const Migration& m : migrations()) {
    // The version is read inside the write transaction, so two processes opening a new store
    // at once apply each migration exactly once.
    db.transaction([&] {
      const int current = db.user_version();
      if (current > latest_schema_version()) {
        throw UserError(db.path() + ": schema version " + std::to_string(current) +
                        " is newer than this ulysses-tune (" +
                        std::to_string(latest_schema_version()) + "); use a newer build");
      }
      if (current >= m.version) return;
      db.exec(m.sql);
      db.exec("PRAGMA user_version = " + std::to_string(m.version));
      ++applied;
    });
  }
  return applied;
}

}  // namespace ulysses::store
