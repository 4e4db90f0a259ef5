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
      {2, "sweeps, their trials, per-step metrics and per-phase times",
       R"sql(
CREATE TABLE sweeps (
  id               INTEGER PRIMARY KEY,
  name             TEXT NOT NULL UNIQUE,
  created_at       TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ', 'now')),
  finished_at      TEXT,            -- NULL while running or when interrupted
  status           TEXT NOT NULL DEFAULT 'running',  -- running | finished | interrupted
  experiment_path  TEXT NOT NULL DEFAULT '',
  experiment_yaml  TEXT NOT NULL DEFAULT '',         -- the experiment file as read
  search           TEXT NOT NULL DEFAULT 'smart',    -- smart | grid
  objective        TEXT NOT NULL DEFAULT 'throughput',
  environment      TEXT NOT NULL DEFAULT '{}',       -- JSON: host, cpu, devices, versions, git
  summary          TEXT NOT NULL DEFAULT '{}'        -- JSON: counts (ran, pruned, skipped, grid)
);
CREATE TABLE trials (
  id                    INTEGER PRIMARY KEY,
  sweep_id              INTEGER NOT NULL REFERENCES sweeps(id) ON DELETE CASCADE,
  key                   TEXT NOT NULL,   -- canonical point + length + probe flag; unique per sweep
  point                 TEXT NOT NULL DEFAULT '{}',  -- JSON: the space's axis values
  config_yaml           TEXT NOT NULL DEFAULT '',    -- the full run config given to the ranks
  config_json           TEXT NOT NULL DEFAULT '{}',  -- the same as JSON
  seqlen                INTEGER NOT NULL,
  probe                 INTEGER NOT NULL DEFAULT 0,  -- 1: attention.skip_all_but_last probe
  world_size            INTEGER NOT NULL,
  dp                    INTEGER NOT NULL,
  sp                    INTEGER NOT NULL,
  status                TEXT NOT NULL,   -- running | ok | oom | failed | timeout | killed |
                                         -- pruned | invalid | skipped
  exit_code             INTEGER,         -- exit status, 128+signal when killed; NULL if not run
  error                 TEXT NOT NULL DEFAULT '',    -- last error line of the failing rank
  reason                TEXT NOT NULL DEFAULT '',    -- why pruned / invalid / skipped
  started_at            TEXT,
  finished_at           TEXT,
  wall_s                REAL,
  run_dir               TEXT NOT NULL DEFAULT '',
  step_ms               REAL,            -- median after warmup
  tokens_per_s          REAL,            -- whole job, median after warmup
  tokens_per_s_per_rank REAL,
  peak_mem_bytes        INTEGER,         -- max over steps (device on CUDA, host RSS on CPU)
  peak_host_bytes       INTEGER,
  final_loss            REAL,
  limit_bytes           INTEGER,         -- per-rank memory limit the trial ran (or was pruned) under
  predicted_peak_bytes  INTEGER,         -- memory model, before the run
  predicted_step_ms     REAL,            -- time model, before the run
  summary               TEXT NOT NULL DEFAULT '{}',  -- summary.json of the run
  UNIQUE (sweep_id, key)
);
CREATE INDEX trials_by_sweep ON trials(sweep_id, status);
CREATE TABLE trial_steps (
  trial_id        INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
  step            INTEGER NOT NULL,
  loss            REAL,
  grad_norm       REAL,
  step_ms         REAL,
  tokens_per_s    REAL,
  peak_mem_bytes  INTEGER,
  PRIMARY KEY (trial_id, step)
);
CREATE TABLE trial_phases (
  trial_id  INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
  phase     TEXT NOT NULL,   -- a phase of metrics.jsonl, or a category total (compute, comm, ...)
  ms        REAL NOT NULL,   -- median per step after warmup
  PRIMARY KEY (trial_id, phase)
);
)sql"},
      {3, "cost-model fits: the trials each calibration was fitted on",
       R"sql(
-- A cost-model fit (`ulysses-tune plan --fit DB`) is a calibration run whose calibrations rows
-- have benchmark 'costmodel.fit' (metric = coefficient name); these rows name the trials it was
-- fitted on, each with its measurement and what the fitted coefficients predict for it.
CREATE TABLE calibration_trials (
  run_id     INTEGER NOT NULL REFERENCES calibration_runs(id) ON DELETE CASCADE,
  trial_id   INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
  kind       TEXT NOT NULL,   -- memory (peak bytes) | time (step ms)
  measured   REAL NOT NULL,
  predicted  REAL NOT NULL,   -- by the fitted coefficients (in-sample)
  PRIMARY KEY (run_id, trial_id, kind)
);
)sql"},
      {4, "the machine's load average while each trial ran",
       R"sql(
-- /proc/loadavg when the sweep started the trial and when it ended, so that a reader can tell a
-- quiet machine's timings from a loaded one's. A separate table: the trials table keeps its
-- columns, so databases without this table read as before.
CREATE TABLE trial_load (
  trial_id        INTEGER PRIMARY KEY REFERENCES trials(id) ON DELETE CASCADE,
  start_load_1m   REAL,      -- 1-minute load average at the trial's start; NULL if unreadable
  end_load_1m     REAL,      -- the same at its end
  cores           INTEGER    -- online CPU cores of the machine that started it
);
)sql"},
      {5, "recommend's numerics checks",
       R"sql(
-- `ulysses-tune recommend` runs a candidate's configuration for a few steps beside the same model
-- on one rank and compares loss, grad norm and eval loss per step (recommend/numerics_check.h).
-- One row per candidate checked; result is the whole check as JSON (both runs' steps, the
-- tolerance, the worst relative difference).
CREATE TABLE numerics_checks (
  id          INTEGER PRIMARY KEY,
  sweep_id    INTEGER NOT NULL REFERENCES sweeps(id) ON DELETE CASCADE,
  trial_id    INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
  created_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ', 'now')),
  status      TEXT NOT NULL,   -- passed | failed | not_run
  reason      TEXT NOT NULL,   -- one line: what disagreed and by how much, or why it did not run
  result      TEXT NOT NULL    -- JSON
);
)sql"},
      {6, "trial slots: where each trial ran and which trials ran beside it",
       R"sql(
-- A sweep may split what it has into slots (core sets, device sets, node sets) and run trials
-- side by side. slot names the one a trial ran on (NULL when the sweep ran one slot);
-- remeasure_of marks a trial that re-measured another one with no other trial running;
-- trial_neighbours holds, in both directions, the trials whose runs overlapped in time.
ALTER TABLE trials ADD COLUMN slot TEXT;
ALTER TABLE trials ADD COLUMN remeasure_of INTEGER REFERENCES trials(id);
CREATE TABLE trial_neighbours (
  trial_id     INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
  neighbour_id INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
  PRIMARY KEY (trial_id, neighbour_id)
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
