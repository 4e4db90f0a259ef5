// Sweeps and trials in the results database (records in trial_record.h, schema
// versions 2, 4 and 6 in migrations.cpp). Every write is one transaction, so a killed sweep leaves
// each trial either absent, `running` (re-run by --resume) or complete with its steps and phases.
// Errors are UserError naming the database file (database.h). Optional fields and "" timestamps
// are stored as NULL; SQLite stores NaN as NULL too, so a NaN optional reads back as nullopt and
// a NaN TrialStep field (a NULL column) reads back as NaN.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tuner/store/database.h"
#include "tuner/store/trial_record.h"

namespace ulysses::store {

// The trials that stand for their configurations: each trial that was re-measured alone
// (another trial's remeasure_of names it) is left out, its re-measure standing for it whatever
// the re-measure's status; the rest keep their order. Pure.
std::vector<TrialRecord> alone_measurements_preferred(std::vector<TrialRecord> trials);

// Borrows a Database whose schema is at least version 2 (Store::open migrates it).
class SweepStore {
 public:
  explicit SweepStore(Database& db) : db_(db) {}
  Database& db() { return db_; }

  // Inserts a sweep; returns its id. created_at "" = now (UTC). Throws UserError when a sweep of
  // that name exists.
  int64_t create_sweep(const SweepRecord& sweep);
  // The sweep of that name / id, or nullopt.
  std::optional<SweepRecord> find_sweep(const std::string& name);
  std::optional<SweepRecord> sweep(int64_t id);
  // Every sweep, oldest first.
  std::vector<SweepRecord> sweeps();
  // The newest sweep (highest id), or nullopt when there is none.
  std::optional<SweepRecord> latest_sweep();
  // Writes status, finished_at, environment and summary of sweep.id.
  void update_sweep(const SweepRecord& sweep);

  // Records that `trial` starts: writes it with status `running` and sets trial.id and
  // trial.status. A row of the same sweep and key (e.g. one a killed sweep left `running`) is
  // overwritten in place: it keeps its id and loses its steps and phases.
  void begin_trial(TrialRecord& trial);
  // Writes the finished trial (every column) with its steps and phases in one transaction,
  // replacing any steps and phases the row had. Phases whose ms is not finite are not stored.
  // REQUIRES: trial.id from begin_trial (a bug otherwise: c10::Error).
  void finish_trial(const TrialRecord& trial, const std::vector<TrialStep>& steps,
                    const std::vector<TrialPhase>& phases);
  // Writes a trial that does not run (pruned, invalid, skipped) in one transaction, as it is
  // (status included); sets trial.id. A row of the same sweep and key is overwritten as in
  // begin_trial.
  void add_trial(TrialRecord& trial);

  // The trial of that id, or nullopt.
  std::optional<TrialRecord> trial(int64_t id);
  // The trials of a sweep in id order.
  std::vector<TrialRecord> trials(int64_t sweep_id);
  // A trial's steps in step order; its phases in the order finish_trial got them.
  std::vector<TrialStep> trial_steps(int64_t trial_id);
  std::vector<TrialPhase> trial_phases(int64_t trial_id);

  // Records the machine's load while the trial ran, replacing what the trial had (one
  // transaction). REQUIRES: load.trial_id names a trial; a schema of version 4 or later.
  void record_trial_load(const TrialLoad& load);
  // The loads recorded for a sweep's trials, in trial id order; empty for a database without the
  // table (schema version 3 or older, opened read-only) or trials that recorded none.
  std::vector<TrialLoad> trial_loads(int64_t sweep_id);

  // Records that the runs of `trial_id` and of each of `neighbour_ids` overlapped in time: both
  // directions, one transaction; pairs already stored and trial_id itself are left out.
  // REQUIRES: the ids name trials; a schema of version 6 or later.
  void record_neighbours(int64_t trial_id, const std::vector<int64_t>& neighbour_ids);
  // Every neighbour pair of a sweep's trials, both directions, ordered by (trial_id,
  // neighbour_id); empty for a database without the table (version 5 or older, read-only).
  std::vector<TrialNeighbour> trial_neighbours(int64_t sweep_id);

 private:
  // True when the trials table has the schema version 6 columns (slot, remeasure_of); a database
  // without them (older, opened read-only or not migrated) reads them as ""/nullopt and writes
  // without them.
  bool with_slots();

  Database& db_;
  std::optional<bool> with_slots_;
};

}  // namespace ulysses::store
