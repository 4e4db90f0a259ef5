// Sweeps and trials in the results database (see sweep_store.h); the row mapping is in
// sweep_rows.h.
#include "tuner/store/sweep_store.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <set>
#include <utility>

#include "common/error.h"
#include "tuner/store/sweep_rows.h"

namespace ulysses::store {

std::vector<TrialRecord> alone_measurements_preferred(std::vector<TrialRecord> trials) {
  std::set<int64_t> remeasured;
  for (const TrialRecord& t : trials) {
    if (t.remeasure_of) remeasured.insert(*t.remeasure_of);
  }
  std::erase_if(trials, [&](const TrialRecord& t) { return remeasured.count(t.id) > 0; });
  return trials;
}

int64_t SweepStore::create_sweep(const SweepRecord& sweep) {
  int64_t id = 0;
  db_.transaction([&] {
    if (find_sweep(sweep.name)) {
      throw UserError(db_.path() + ": a sweep named '" + sweep.name + "' exists already");
    }
    Statement s = db_.prepare(
        "INSERT INTO sweeps (name, created_at, finished_at, status, experiment_path, "
        "experiment_yaml, search, objective, environment, summary) VALUES "
        "(?, COALESCE(?, strftime('%Y-%m-%dT%H:%M:%SZ', 'now')), ?, ?, ?, ?, ?, ?, ?, ?)");
    s.bind(1, sweep.name);
    bind_text_or_null(s, 2, sweep.created_at);
    bind_text_or_null(s, 3, sweep.finished_at);
    s.bind(4, sweep.status).bind(5, sweep.experiment_path).bind(6, sweep.experiment_yaml);
    s.bind(7, sweep.search).bind(8, sweep.objective).bind(9, sweep.environment);
    s.bind(10, sweep.summary).run();
    id = db_.last_insert_rowid();
  });
  return id;
}

std::optional<SweepRecord> SweepStore::find_sweep(const std::string& name) {
  Statement s = db_.prepare(std::string(kSelectSweep) + "WHERE name = ?");
  s.bind(1, name);
  if (!s.step()) return std::nullopt;
  return read_sweep(s);
}

std::optional<SweepRecord> SweepStore::sweep(int64_t id) {
  Statement s = db_.prepare(std::string(kSelectSweep) + "WHERE id = ?");
  s.bind(1, id);
  if (!s.step()) return std::nullopt;
  return read_sweep(s);
}

std::vector<SweepRecord> SweepStore::sweeps() {
  Statement s = db_.prepare(std::string(kSelectSweep) + "ORDER BY id");
  std::vector<SweepRecord> out;
  while (s.step()) out.push_back(read_sweep(s));
  return out;
}

std::optional<SweepRecord> SweepStore::latest_sweep() {
  Statement s = db_.prepare(std::string(kSelectSweep) + "ORDER BY id DESC LIMIT 1");
  if (!s.step()) return std::nullopt;
  return read_sweep(s);
}

void SweepStore::update_sweep(const SweepRecord& sweep) {
  db_.transaction([&] {
    Statement s = db_.prepare(
        "UPDATE sweeps SET status = ?, finished_at = ?, environment = ?, summary = ? "
        "WHERE id = ?");
    s.bind(1, sweep.status);
    bind_text_or_null(s, 2, sweep.finished_at);
    s.bind(3, sweep.environment).bind(4, sweep.summary).bind(5, sweep.id).run();
  });
}

namespace {

// Writes `trial` over any row of its (sweep_id, key), drops that row's steps and phases, and
// returns the row's id. REQUIRES: inside a transaction.
int64_t upsert_trial(Database& db, const TrialRecord& trial, bool with_slots) {
  Statement insert = db.prepare(trial_upsert_sql(with_slots));
  bind_trial(insert, trial, with_slots);
  insert.run();
  Statement find = db.prepare("SELECT id FROM trials WHERE sweep_id = ? AND key = ?");
  find.bind(1, trial.sweep_id).bind(2, trial.key);
  TORCH_CHECK(find.step(), "upsert_trial: row of key ", trial.key, " not found after insert");
  const int64_t id = find.column_int(0);
  db.prepare("DELETE FROM trial_steps WHERE trial_id = ?").bind(1, id).run();
  db.prepare("DELETE FROM trial_phases WHERE trial_id = ?").bind(1, id).run();
  if (with_slots) {  // a re-run has neighbours of its own
    db.prepare("DELETE FROM trial_neighbours WHERE trial_id = ? OR neighbour_id = ?")
        .bind(1, id)
        .bind(2, id)
        .run();
  }
  return id;
}

}  // namespace

void SweepStore::begin_trial(TrialRecord& trial) {
  TrialRecord running = trial;
  running.status = "running";
  int64_t id = 0;
  db_.transaction([&] { id = upsert_trial(db_, running, with_slots()); });
  trial.id = id;
  trial.status = "running";
}

void SweepStore::add_trial(TrialRecord& trial) {
  int64_t id = 0;
  db_.transaction([&] { id = upsert_trial(db_, trial, with_slots()); });
  trial.id = id;
}

void SweepStore::finish_trial(const TrialRecord& trial, const std::vector<TrialStep>& steps,
                              const std::vector<TrialPhase>& phases) {
  TORCH_CHECK(trial.id > 0, "finish_trial: trial ", trial.key, " has no id (call begin_trial)");
  db_.transaction([&] {
    Statement update = db_.prepare(trial_update_sql(with_slots()));
    const int id_parameter = bind_trial(update, trial, with_slots());
    update.bind(id_parameter, trial.id).run();
    Statement changed = db_.prepare("SELECT changes()");
    changed.step();
    TORCH_CHECK(changed.column_int(0) == 1, "finish_trial: no trial with id ", trial.id);
    db_.prepare("DELETE FROM trial_steps WHERE trial_id = ?").bind(1, trial.id).run();
    db_.prepare("DELETE FROM trial_phases WHERE trial_id = ?").bind(1, trial.id).run();
    for (const TrialStep& step : steps) {
      Statement s = db_.prepare(
          "INSERT INTO trial_steps (trial_id, step, loss, grad_norm, step_ms, tokens_per_s, "
          "peak_mem_bytes) VALUES (?, ?, ?, ?, ?, ?, ?)");
      s.bind(1, trial.id).bind(2, step.step).bind(3, step.loss).bind(4, step.grad_norm);
      s.bind(5, step.step_ms).bind(6, step.tokens_per_s).bind(7, step.peak_mem_bytes).run();
    }
    for (const TrialPhase& phase : phases) {
      if (!std::isfinite(phase.ms)) continue;  // see sweep_store.h
      db_.prepare("INSERT INTO trial_phases (trial_id, phase, ms) VALUES (?, ?, ?)")
          .bind(1, trial.id)
          .bind(2, phase.phase)
          .bind(3, phase.ms)
          .run();
    }
  });
}

std::optional<TrialRecord> SweepStore::trial(int64_t id) {
  Statement s = db_.prepare(trial_select_sql(with_slots()) + "WHERE id = ?");
  s.bind(1, id);
  if (!s.step()) return std::nullopt;
  return read_trial(s);
}

std::vector<TrialRecord> SweepStore::trials(int64_t sweep_id) {
  Statement s = db_.prepare(trial_select_sql(with_slots()) + "WHERE sweep_id = ? ORDER BY id");
  s.bind(1, sweep_id);
  std::vector<TrialRecord> out;
  while (s.step()) out.push_back(read_trial(s));
  return out;
}

std::vector<TrialStep> SweepStore::trial_steps(int64_t trial_id) {
  Statement s = db_.prepare(
      "SELECT step, loss, grad_norm, step_ms, tokens_per_s, peak_mem_bytes FROM trial_steps "
      "WHERE trial_id = ? ORDER BY step");
  s.bind(1, trial_id);
  std::vector<TrialStep> out;
  while (s.step()) out.push_back(read_trial_step(s));
  return out;
}

std::vector<TrialPhase> SweepStore::trial_phases(int64_t trial_id) {
  Statement s = db_.prepare("SELECT phase, ms FROM trial_phases WHERE trial_id = ? ORDER BY rowid");
  s.bind(1, trial_id);
  std::vector<TrialPhase> out;
  while (s.step()) out.push_back(TrialPhase{s.column_text(0), s.column_double(1)});
  return out;
}

void SweepStore::record_trial_load(const TrialLoad& load) {
  db_.transaction([&] {
    Statement s = db_.prepare(
        "INSERT OR REPLACE INTO trial_load (trial_id, start_load_1m, end_load_1m, cores) "
        "VALUES (?, ?, ?, ?)");
    s.bind(1, load.trial_id);
    load.start_load_1m ? s.bind(2, *load.start_load_1m) : s.bind_null(2);
    load.end_load_1m ? s.bind(3, *load.end_load_1m) : s.bind_null(3);
    load.cores > 0 ? s.bind(4, load.cores) : s.bind_null(4);
    s.run();
  });
}

std::vector<TrialLoad> SweepStore::trial_loads(int64_t sweep_id) {
  std::vector<TrialLoad> out;
  if (!db_.has_table("trial_load")) return out;  // written before loads were recorded
  Statement s = db_.prepare(
      "SELECT l.trial_id, l.start_load_1m, l.end_load_1m, l.cores FROM trial_load l "
      "JOIN trials t ON t.id = l.trial_id WHERE t.sweep_id = ? ORDER BY l.trial_id");
  s.bind(1, sweep_id);
  while (s.step()) {
    TrialLoad load;
    load.trial_id = s.column_int(0);
    if (!s.is_null(1)) load.start_load_1m = s.column_double(1);
    if (!s.is_null(2)) load.end_load_1m = s.column_double(2);
    load.cores = s.is_null(3) ? 0 : s.column_int(3);
    out.push_back(load);
  }
  return out;
}

bool SweepStore::with_slots() {
  if (!with_slots_) with_slots_ = db_.has_column("trials", "slot");
  return *with_slots_;
}

void SweepStore::record_neighbours(int64_t trial_id, const std::vector<int64_t>& neighbour_ids) {
  TORCH_CHECK(with_slots(), "record_neighbours: ", db_.path(), " has no trial_neighbours table");
  db_.transaction([&] {
    for (int64_t other : neighbour_ids) {
      if (other == trial_id) continue;
      for (const auto& [a, b] : {std::pair{trial_id, other}, std::pair{other, trial_id}}) {
        db_.prepare("INSERT OR IGNORE INTO trial_neighbours (trial_id, neighbour_id) VALUES (?, ?)")
            .bind(1, a)
            .bind(2, b)
            .run();
      }
    }
  });
}

std::vector<TrialNeighbour> SweepStore::trial_neighbours(int64_t sweep_id) {
  std::vector<TrialNeighbour> out;
  if (!db_.has_table("trial_neighbours")) return out;  // written before slots existed
  Statement s = db_.prepare(
      "SELECT n.trial_id, n.neighbour_id FROM trial_neighbours n JOIN trials t ON t.id = "
      "n.trial_id WHERE t.sweep_id = ? ORDER BY n.trial_id, n.neighbour_id");
  s.bind(1, sweep_id);
  while (s.step()) out.push_back(TrialNeighbour{s.column_int(0), s.column_int(1)});
  return out;
}

}  // namespace ulysses::store
