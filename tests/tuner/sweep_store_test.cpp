// Sweeps and trials in the store (tuner/store/sweep_store.h): every column round trips (NULLs
// included), begin/finish/add, a `running` row left by a killed sweep is replaced, a schema
// version 1 database migrates keeping its rows, and failed or killed writes leave nothing half
// written (PRAGMA integrity_check = ok).
#include "tuner/store/sweep_store.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <filesystem>

#include "common/error.h"
#include "tuner/store/migrations.h"
#include "tuner/store/store.h"
#include "common/remove_tree.h"

namespace fs = std::filesystem;

namespace ulysses::store {
namespace {

class SweepStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sweep-store-test-" + std::to_string(getpid()));
    ulysses::remove_tree(dir_);
    path_ = (dir_ / "results.db").string();
  }
  void TearDown() override { ulysses::remove_tree(dir_); }

  static void expect_integrity_ok(Database& db) {
    Statement check = db.prepare("PRAGMA integrity_check");
    ASSERT_TRUE(check.step());
    EXPECT_EQ(check.column_text(0), "ok");
  }
  static int64_t count(Database& db, const std::string& table) {
    Statement s = db.prepare("SELECT count(*) FROM " + table);
    s.step();
    return s.column_int(0);
  }

  fs::path dir_;
  std::string path_;
};

SweepRecord make_sweep(const std::string& name) {
  SweepRecord s;
  s.name = name;
  s.experiment_path = "experiments/quickstart-cpu.yaml";
  s.experiment_yaml = "name: q\nspace: {sp: auto}\n";
  s.search = "grid";
  s.objective = "max-seqlen";
  s.environment = R"({"host":"box","torch":"2.13.0"})";
  s.summary = R"({"trials_run":3})";
  return s;
}

// A trial with every optional field set and text that needs quoting somewhere.
TrialRecord full_trial(int64_t sweep_id, const std::string& key) {
  TrialRecord t;
  t.sweep_id = sweep_id;
  t.key = key;
  t.point = R"({"mesh.sp":2,"memory.tiled_mlp":4})";
  t.config_yaml = "mesh: {sp: 2, dp: 1}\n";
  t.config_json = R"({"mesh":{"sp":2}})";
  t.seqlen = 8192;
  t.probe = true;
  t.world_size = 4;
  t.dp = 2;
  t.sp = 2;
  t.status = "oom";
  t.exit_code = 12;
  t.error = "out of memory: tried to allocate 2 GiB, \"quoted\"\nsecond line";
  t.reason = "why, not";
  t.started_at = "2025-01-02T03:04:05Z";
  t.finished_at = "2025-01-02T03:05:06Z";
  t.wall_s = 61.25;
  t.run_dir = "runs/q/trial-7";
  t.step_ms = 123.5;
  t.tokens_per_s = 4096.0 / 0.1235;
  t.tokens_per_s_per_rank = 4096.0 / 0.1235 / 4;
  t.peak_mem_bytes = int64_t{5} << 33;  // > 2^32: needs 64 bits
  t.peak_host_bytes = 1234567;
  t.final_loss = 6.875;
  t.limit_bytes = int64_t{80} << 30;
  t.predicted_peak_bytes = int64_t{3} << 30;
  t.predicted_step_ms = 99.5;
  t.summary = R"({"median_step_ms":123.5})";
  t.slot = "cores 0-0";
  return t;
}

void expect_same(const TrialRecord& a, const TrialRecord& b) {
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.sweep_id, b.sweep_id);
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.point, b.point);
  EXPECT_EQ(a.config_yaml, b.config_yaml);
  EXPECT_EQ(a.config_json, b.config_json);
  EXPECT_EQ(a.seqlen, b.seqlen);
  EXPECT_EQ(a.probe, b.probe);
  EXPECT_EQ(a.world_size, b.world_size);
  EXPECT_EQ(a.dp, b.dp);
  EXPECT_EQ(a.sp, b.sp);
  EXPECT_EQ(a.status, b.status);
  EXPECT_EQ(a.exit_code, b.exit_code);
  EXPECT_EQ(a.error, b.error);
  EXPECT_EQ(a.reason, b.reason);
  EXPECT_EQ(a.started_at, b.started_at);
  EXPECT_EQ(a.finished_at, b.finished_at);
  EXPECT_EQ(a.wall_s, b.wall_s);
  EXPECT_EQ(a.run_dir, b.run_dir);
  EXPECT_EQ(a.step_ms, b.step_ms);
  EXPECT_EQ(a.tokens_per_s, b.tokens_per_s);
  EXPECT_EQ(a.tokens_per_s_per_rank, b.tokens_per_s_per_rank);
  EXPECT_EQ(a.peak_mem_bytes, b.peak_mem_bytes);
  EXPECT_EQ(a.peak_host_bytes, b.peak_host_bytes);
  EXPECT_EQ(a.final_loss, b.final_loss);
  EXPECT_EQ(a.limit_bytes, b.limit_bytes);
  EXPECT_EQ(a.predicted_peak_bytes, b.predicted_peak_bytes);
  EXPECT_EQ(a.predicted_step_ms, b.predicted_step_ms);
  EXPECT_EQ(a.summary, b.summary);
  EXPECT_EQ(a.slot, b.slot);
  EXPECT_EQ(a.remeasure_of, b.remeasure_of);
}

// A cost-model fit is a calibration run (benchmark costmodel.fit) with the trials it was fitted
// on; the newest one per device is found; deleting a trial removes its fit row (cascade).
TEST_F(SweepStoreTest, ModelFitsKeepTheirTrialsAndTheNewestIsFound) {
  Store store = Store::open(path_);
  EXPECT_EQ(store.schema_version(), latest_schema_version());
  SweepStore sweeps(store.db());
  const int64_t sweep_id = sweeps.create_sweep(make_sweep("fitted"));
  TrialRecord a = full_trial(sweep_id, "a"), b = full_trial(sweep_id, "b");
  sweeps.add_trial(a);
  sweeps.add_trial(b);
  EXPECT_FALSE(store.latest_model_fit("cpu").has_value());
  store.add_calibration_run({0, "", "cpu-local", "box", "cpu", 4, "ulysses-bench"},
                            {{0, "AllToAll/bytes:1024", "algbw_GBps", 1.5, "GB/s", "{}"}});
  EXPECT_FALSE(store.latest_model_fit("cpu").has_value());  // a benchmark run is not a fit
  const CalibrationRun run{0, "", "cpu-local", "box", "cpu", 4, "ulysses-tune plan --fit"};
  const std::vector<Calibration> rows = {{0, kCostModelFitBenchmark, "ms_per_tflop", 2.5, "ms", "{}"}};
  store.add_model_fit(run, rows, {});
  const int64_t newest = store.add_model_fit(
      run, rows, {{a.id, "memory", 100.0, 110.0}, {a.id, "time", 20.0, 19.0},
                  {b.id, "memory", 200.0, 190.0}});
  ASSERT_TRUE(store.latest_model_fit("cpu").has_value());
  EXPECT_EQ(store.latest_model_fit("cpu")->id, newest);
  EXPECT_EQ(store.latest_model_fit("")->id, newest);
  EXPECT_FALSE(store.latest_model_fit("cuda").has_value());
  const std::vector<FitTrial> trials = store.fit_trials(newest);
  ASSERT_EQ(trials.size(), 3u);
  EXPECT_EQ(trials[0].trial_id, a.id);
  EXPECT_EQ(trials[0].kind, "memory");
  EXPECT_DOUBLE_EQ(trials[0].predicted, 110.0);
  EXPECT_EQ(trials[1].kind, "time");
  EXPECT_EQ(store.calibrations(newest).at(0).metric, "ms_per_tflop");
  store.db().exec("DELETE FROM trials WHERE id = " + std::to_string(b.id));
  EXPECT_EQ(store.fit_trials(newest).size(), 2u);
}

TEST_F(SweepStoreTest, SweepRoundTripsAndNamesAreUnique) {
  Store store = Store::open(path_);
  SweepStore sweeps(store.db());
  EXPECT_FALSE(sweeps.latest_sweep().has_value());
  SweepRecord first = make_sweep("first");
  first.created_at = "2025-01-01T00:00:00Z";
  first.id = sweeps.create_sweep(first);
  const int64_t second_id = sweeps.create_sweep(make_sweep("second"));
  EXPECT_GT(second_id, first.id);

  const auto back = sweeps.find_sweep("first");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->id, first.id);
  EXPECT_EQ(back->created_at, "2025-01-01T00:00:00Z");
  EXPECT_EQ(back->finished_at, "");  // NULL while running
  EXPECT_EQ(back->status, "running");
  EXPECT_EQ(back->experiment_path, first.experiment_path);
  EXPECT_EQ(back->experiment_yaml, first.experiment_yaml);
  EXPECT_EQ(back->search, "grid");
  EXPECT_EQ(back->objective, "max-seqlen");
  EXPECT_EQ(back->environment, first.environment);
  EXPECT_EQ(back->summary, first.summary);
  EXPECT_EQ(sweeps.sweep(second_id)->name, "second");
  EXPECT_EQ(sweeps.sweep(second_id)->created_at.size(), 20u);  // default: now, YYYY-MM-DDTHH:MM:SSZ
  EXPECT_EQ(sweeps.latest_sweep()->id, second_id);
  ASSERT_EQ(sweeps.sweeps().size(), 2u);
  EXPECT_EQ(sweeps.sweeps()[0].name, "first");
  EXPECT_FALSE(sweeps.find_sweep("third").has_value());
  EXPECT_FALSE(sweeps.sweep(999).has_value());
  {
    Statement s = store.db().prepare("SELECT finished_at IS NULL FROM sweeps WHERE id = ?");
    s.bind(1, first.id).step();
    EXPECT_EQ(s.column_int(0), 1);
  }

  first.status = "finished";
  first.finished_at = "2025-01-01T01:00:00Z";
  first.summary = R"({"trials_run":5,"best_trial":2})";
  first.environment = R"({"host":"other"})";
  first.name = "ignored";  // update_sweep writes status, finished_at, environment, summary only
  sweeps.update_sweep(first);
  const auto updated = sweeps.sweep(first.id);
  EXPECT_EQ(updated->name, "first");
  EXPECT_EQ(updated->status, "finished");
  EXPECT_EQ(updated->finished_at, "2025-01-01T01:00:00Z");
  EXPECT_EQ(updated->summary, first.summary);
  EXPECT_EQ(updated->environment, first.environment);

  try {
    sweeps.create_sweep(make_sweep("second"));
    ADD_FAILURE() << "a second sweep named 'second' was accepted";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos);
    EXPECT_NE(what.find("'second' exists"), std::string::npos) << what;
    EXPECT_EQ(what.rfind(path_, 0), 0u) << what;
  }
  EXPECT_EQ(sweeps.sweeps().size(), 2u);
  expect_integrity_ok(store.db());
}

TEST_F(SweepStoreTest, EveryTrialColumnRoundTripsIncludingNulls) {
  Store store = Store::open(path_);
  SweepStore sweeps(store.db());
  const int64_t sweep_id = sweeps.create_sweep(make_sweep("s"));

  TrialRecord full = full_trial(sweep_id, "full");
  sweeps.add_trial(full);
  ASSERT_GT(full.id, 0);
  expect_same(*sweeps.trial(full.id), full);

  TrialRecord bare;  // every optional unset, every text at its default
  bare.sweep_id = sweep_id;
  bare.key = "bare";
  bare.seqlen = 1024;
  bare.status = "invalid";
  sweeps.add_trial(bare);
  const TrialRecord back = *sweeps.trial(bare.id);
  expect_same(back, bare);
  EXPECT_FALSE(back.ran());
  Statement nulls = store.db().prepare(
      "SELECT exit_code IS NULL AND started_at IS NULL AND finished_at IS NULL AND wall_s IS NULL "
      "AND step_ms IS NULL AND tokens_per_s IS NULL AND tokens_per_s_per_rank IS NULL AND "
      "peak_mem_bytes IS NULL AND peak_host_bytes IS NULL AND final_loss IS NULL AND "
      "limit_bytes IS NULL AND predicted_peak_bytes IS NULL AND predicted_step_ms IS NULL, "
      "point, config_json, summary FROM trials WHERE id = ?");
  nulls.bind(1, bare.id).step();
  EXPECT_EQ(nulls.column_int(0), 1);
  EXPECT_EQ(nulls.column_text(1), "{}");
  EXPECT_EQ(nulls.column_text(2), "{}");
  EXPECT_EQ(nulls.column_text(3), "{}");

  // NaN is stored as NULL: an optional reads back unset.
  TrialRecord diverged = full_trial(sweep_id, "nan");
  diverged.final_loss = std::nan("");
  sweeps.add_trial(diverged);
  EXPECT_FALSE(sweeps.trial(diverged.id)->final_loss.has_value());

  const auto all = sweeps.trials(sweep_id);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].key, "full");
  EXPECT_EQ(all[1].key, "bare");
  EXPECT_EQ(all[2].key, "nan");
  EXPECT_TRUE(sweeps.trials(sweep_id + 1).empty());
  EXPECT_FALSE(sweeps.trial(12345).has_value());
  expect_integrity_ok(store.db());
}

TEST_F(SweepStoreTest, BeginFinishWritesTheTrialWithStepsAndPhases) {
  Store store = Store::open(path_);
  SweepStore sweeps(store.db());
  TrialRecord trial = full_trial(sweeps.create_sweep(make_sweep("s")), "k");
  trial.status = "ok";  // begin_trial writes `running` whatever the record says
  trial.exit_code.reset();
  sweeps.begin_trial(trial);
  ASSERT_GT(trial.id, 0);
  EXPECT_EQ(trial.status, "running");
  EXPECT_EQ(sweeps.trial(trial.id)->status, "running");
  EXPECT_TRUE(sweeps.trial_steps(trial.id).empty());

  trial.status = "ok";
  trial.exit_code = 0;
  trial.error = "";
  std::vector<TrialStep> steps = {{1, 7.0, 1.5, 200.0, 20.0, 1000},
                                  {2, 6.5, 1.25, 100.0, 40.0, 2000},
                                  {3, std::nan(""), 1.0, 101.0, 39.0, 2001}};
  std::vector<TrialPhase> phases = {
      {"compute_ms", 60.0}, {"comm_ms", 25.0}, {"a2a", 25.0}, {"broken", std::nan("")}};
  sweeps.finish_trial(trial, steps, phases);
  expect_same(*sweeps.trial(trial.id), trial);
  const auto steps_back = sweeps.trial_steps(trial.id);
  ASSERT_EQ(steps_back.size(), 3u);
  EXPECT_EQ(steps_back[1].step, 2);
  EXPECT_DOUBLE_EQ(steps_back[1].loss, 6.5);
  EXPECT_DOUBLE_EQ(steps_back[1].grad_norm, 1.25);
  EXPECT_DOUBLE_EQ(steps_back[1].step_ms, 100.0);
  EXPECT_DOUBLE_EQ(steps_back[1].tokens_per_s, 40.0);
  EXPECT_EQ(steps_back[1].peak_mem_bytes, 2000);
  EXPECT_TRUE(std::isnan(steps_back[2].loss));  // NULL -> NaN
  const auto phases_back = sweeps.trial_phases(trial.id);
  ASSERT_EQ(phases_back.size(), 3u);  // the non-finite phase is not stored
  EXPECT_EQ(phases_back[0].phase, "compute_ms");
  EXPECT_EQ(phases_back[2].phase, "a2a");
  EXPECT_DOUBLE_EQ(phases_back[1].ms, 25.0);

  // Finishing again replaces the steps and phases instead of adding to them.
  sweeps.finish_trial(trial, {steps[0]}, {phases[0]});
  EXPECT_EQ(sweeps.trial_steps(trial.id).size(), 1u);
  EXPECT_EQ(sweeps.trial_phases(trial.id).size(), 1u);

  TrialRecord unknown = trial;
  unknown.id = trial.id + 100;
  EXPECT_THROW(sweeps.finish_trial(unknown, {}, {}), c10::Error);
  TrialRecord no_id = trial;
  no_id.id = 0;
  EXPECT_THROW(sweeps.finish_trial(no_id, {}, {}), c10::Error);
  expect_integrity_ok(store.db());
}

TEST_F(SweepStoreTest, ARunningRowLeftByAKilledSweepIsReplaced) {
  int64_t sweep_id = 0, first_id = 0;
  {
    Store store = Store::open(path_);
    SweepStore sweeps(store.db());
    sweep_id = sweeps.create_sweep(make_sweep("s"));
    TrialRecord trial = full_trial(sweep_id, "k");
    trial.run_dir = "runs/first-attempt";
    sweeps.begin_trial(trial);
    first_id = trial.id;
  }  // the sweep dies here: the row stays `running`
  Store store = Store::open(path_);
  SweepStore sweeps(store.db());
  ASSERT_EQ(sweeps.trials(sweep_id).size(), 1u);
  EXPECT_EQ(sweeps.trials(sweep_id)[0].status, "running");

  TrialRecord again = full_trial(sweep_id, "k");
  again.run_dir = "runs/second-attempt";
  again.seqlen = 4096;
  sweeps.begin_trial(again);
  EXPECT_EQ(again.id, first_id);  // the same row, overwritten
  auto rows = sweeps.trials(sweep_id);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].run_dir, "runs/second-attempt");
  EXPECT_EQ(rows[0].seqlen, 4096);
  EXPECT_EQ(rows[0].status, "running");

  again.status = "ok";
  again.exit_code = 0;
  sweeps.finish_trial(again, {{1, 2.0, 1.0, 3.0, 4.0, 5}}, {{"compute_ms", 1.0}});
  // A later add_trial of the same key (e.g. re-judged as skipped) replaces it, steps included.
  TrialRecord skipped = full_trial(sweep_id, "k");
  skipped.status = "skipped";
  skipped.reason = "dominated by trial 1";
  skipped.exit_code.reset();
  sweeps.add_trial(skipped);
  EXPECT_EQ(skipped.id, first_id);
  rows = sweeps.trials(sweep_id);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].status, "skipped");
  EXPECT_EQ(rows[0].reason, "dominated by trial 1");
  EXPECT_TRUE(sweeps.trial_steps(first_id).empty());
  EXPECT_TRUE(sweeps.trial_phases(first_id).empty());
  // The same key in another sweep is another trial.
  TrialRecord other = full_trial(sweeps.create_sweep(make_sweep("t")), "k");
  sweeps.add_trial(other);
  EXPECT_NE(other.id, first_id);
  expect_integrity_ok(store.db());
}

TEST_F(SweepStoreTest, ASchemaVersion1DatabaseMigratesKeepingItsRows) {
  {
    Database db = Database::open(path_);
    db.transaction([&] {
      db.exec(migrations().at(0).sql);
      db.exec("PRAGMA user_version = 1");
    });
    db.exec(
        "INSERT INTO calibration_runs (hardware, host, device, world_size, command) "
        "VALUES ('cpu-local', 'box', 'cpu', 2, 'ulysses-bench')");
    db.exec(
        "INSERT INTO calibrations (run_id, benchmark, metric, value, unit) "
        "VALUES (1, 'AllToAll/bytes:1024/ranks:2', 'busbw_GBps', 1.5, 'GB/s')");
    ASSERT_FALSE(db.has_table("sweeps"));
  }
  Store store = Store::open(path_);
  EXPECT_EQ(store.schema_version(), 6);
  EXPECT_EQ(latest_schema_version(), 6) << "a new migration: extend this test";
  for (const char* table : {"sweeps", "trials", "trial_steps", "trial_phases", "calibration_trials",
                            "trial_load", "numerics_checks", "trial_neighbours"})
    EXPECT_TRUE(store.db().has_table(table)) << table;
  const auto runs = store.calibration_runs();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].hardware, "cpu-local");
  const auto rows = store.calibrations(runs[0].id);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_DOUBLE_EQ(rows[0].value, 1.5);
  EXPECT_EQ(rows[0].params, "{}");
  SweepStore sweeps(store.db());
  TrialRecord trial = full_trial(sweeps.create_sweep(make_sweep("after")), "k");
  sweeps.add_trial(trial);
  EXPECT_EQ(sweeps.trials(trial.sweep_id).size(), 1u);
  EXPECT_FALSE(store.latest_model_fit("").has_value());  // the benchmark run is not a fit
  expect_integrity_ok(store.db());
}

// The machine's load per trial (schema version 4) round trips; a version 3 database (written
// before loads were recorded) still reads, read-only too, with no loads, and migrates.
TEST_F(SweepStoreTest, TrialLoadsRoundTripAndAVersion3DatabaseStillReads) {
  {
    Database db = Database::open(path_);
    for (int v = 0; v < 3; ++v) {
      db.transaction([&] {
        db.exec(migrations().at(v).sql);
        db.exec("PRAGMA user_version = " + std::to_string(v + 1));
      });
    }
    SweepStore sweeps(db);
    TrialRecord t = full_trial(sweeps.create_sweep(make_sweep("old")), "k");
    sweeps.add_trial(t);
  }
  {
    Database old = Database::open(path_, Database::Mode::kReadOnly);
    SweepStore sweeps(old);
    const auto sweep = sweeps.find_sweep("old");
    ASSERT_TRUE(sweep.has_value());
    EXPECT_EQ(sweeps.trials(sweep->id).size(), 1u);
    EXPECT_TRUE(sweeps.trial_loads(sweep->id).empty());
  }
  Store store = Store::open(path_);
  SweepStore sweeps(store.db());
  const int64_t sweep_id = sweeps.find_sweep("old")->id;
  const int64_t trial_id = sweeps.trials(sweep_id).at(0).id;
  TrialLoad load;
  load.trial_id = trial_id;
  load.start_load_1m = 0.25;
  load.cores = 2;
  sweeps.record_trial_load(load);
  load.end_load_1m = 1.5;  // replaces the row
  sweeps.record_trial_load(load);
  const std::vector<TrialLoad> loads = sweeps.trial_loads(sweep_id);
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_EQ(loads[0].trial_id, trial_id);
  EXPECT_EQ(loads[0].start_load_1m, 0.25);
  EXPECT_EQ(loads[0].end_load_1m, 1.5);
  EXPECT_EQ(loads[0].cores, 2);
  expect_integrity_ok(store.db());
}

// Slots (schema version 6): a trial's slot and remeasure_of round trip, neighbours are stored in
// both directions once, a re-run of a trial drops its old neighbours, deleting a trial removes
// its pairs, and a version 5 database reads (read-only too) with no slots or neighbours, writes
// trials without the columns, and migrates.
TEST_F(SweepStoreTest, SlotsRemeasuresAndNeighboursRoundTripAndAVersion5DatabaseStillReads) {
  {
    Database db = Database::open(path_);
    for (int v = 0; v < 5; ++v) {
      db.transaction([&] {
        db.exec(migrations().at(v).sql);
        db.exec("PRAGMA user_version = " + std::to_string(v + 1));
      });
    }
    SweepStore sweeps(db);
    TrialRecord t = full_trial(sweeps.create_sweep(make_sweep("old")), "k");
    sweeps.add_trial(t);  // written without the slot columns
    TrialRecord back = *sweeps.trial(t.id);
    EXPECT_EQ(back.slot, "");
    EXPECT_FALSE(back.remeasure_of.has_value());
  }
  {
    Database old = Database::open(path_, Database::Mode::kReadOnly);
    SweepStore sweeps(old);
    const int64_t sweep_id = sweeps.find_sweep("old")->id;
    EXPECT_EQ(sweeps.trials(sweep_id).at(0).slot, "");
    EXPECT_TRUE(sweeps.trial_neighbours(sweep_id).empty());
  }
  Store store = Store::open(path_);
  SweepStore sweeps(store.db());
  const int64_t sweep_id = sweeps.create_sweep(make_sweep("slots"));
  TrialRecord a = full_trial(sweep_id, "a"), b = full_trial(sweep_id, "b");
  TrialRecord c = full_trial(sweep_id, "c");
  b.slot = "cores 1-1";
  c.slot = "";
  sweeps.add_trial(a);
  sweeps.add_trial(b);
  sweeps.add_trial(c);
  TrialRecord again = full_trial(sweep_id, "a remeasure");
  again.remeasure_of = a.id;
  sweeps.add_trial(again);
  expect_same(*sweeps.trial(again.id), again);
  expect_same(*sweeps.trial(b.id), b);
  expect_same(*sweeps.trial(c.id), c);
  Statement null_slot = store.db().prepare("SELECT slot IS NULL FROM trials WHERE id = ?");
  null_slot.bind(1, c.id).step();
  EXPECT_EQ(null_slot.column_int(0), 1);

  sweeps.record_neighbours(a.id, {b.id, c.id, a.id});
  sweeps.record_neighbours(b.id, {a.id});  // already stored: no duplicate
  auto pairs = [&] {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const TrialNeighbour& n : sweeps.trial_neighbours(sweep_id)) {
      out.emplace_back(n.trial_id, n.neighbour_id);
    }
    return out;
  };
  using Pairs = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(pairs(), (Pairs{{a.id, b.id}, {a.id, c.id}, {b.id, a.id}, {c.id, a.id}}));
  EXPECT_TRUE(sweeps.trial_neighbours(sweep_id + 1).empty());

  TrialRecord rerun = full_trial(sweep_id, "c");  // --resume runs c again: new neighbours
  sweeps.begin_trial(rerun);
  EXPECT_EQ(rerun.id, c.id);
  EXPECT_EQ(pairs(), (Pairs{{a.id, b.id}, {b.id, a.id}}));
  store.db().prepare("DELETE FROM trials WHERE id = ?").bind(1, b.id).run();
  EXPECT_TRUE(pairs().empty());
  expect_integrity_ok(store.db());
}

TEST_F(SweepStoreTest, AFailedFinishLeavesTheTrialRunningWithNothingHalfWritten) {
  Store store = Store::open(path_);
  SweepStore sweeps(store.db());
  TrialRecord trial = full_trial(sweeps.create_sweep(make_sweep("s")), "k");
  sweeps.begin_trial(trial);
  const TrialRecord begun = trial;
  // The last write of finish_trial (a phase row) fails: the trial update and the steps before it
  // must roll back with it.
  store.db().exec(
      "CREATE TRIGGER refuse_phase BEFORE INSERT ON trial_phases WHEN NEW.phase = 'boom' "
      "BEGIN SELECT RAISE(ABORT, 'disk full'); END");
  trial.status = "ok";
  trial.exit_code = 0;
  trial.step_ms = 1.0;
  EXPECT_THROW(sweeps.finish_trial(trial, {{1, 1.0, 1.0, 1.0, 1.0, 1}, {2, 1.0, 1.0, 1.0, 1.0, 1}},
                                   {{"compute_ms", 1.0}, {"boom", 2.0}}),
               UserError);
  expect_same(*sweeps.trial(trial.id), begun);  // status `running`, as begin_trial wrote it
  EXPECT_EQ(count(store.db(), "trial_steps"), 0);
  EXPECT_EQ(count(store.db(), "trial_phases"), 0);

  // An exception thrown by the caller inside a transaction rolls back the same way.
  EXPECT_THROW(store.db().transaction([&] {
    store.db().exec("UPDATE trials SET status = 'ok'");
    store.db().exec("INSERT INTO trial_steps (trial_id, step) VALUES (" + std::to_string(trial.id) +
                    ", 1)");
    throw std::runtime_error("killed halfway");
  }),
               std::runtime_error);
  EXPECT_EQ(sweeps.trial(trial.id)->status, "running");
  EXPECT_EQ(count(store.db(), "trial_steps"), 0);
  expect_integrity_ok(store.db());
}

TEST_F(SweepStoreTest, AProcessKilledInsideAWriteLeavesAValidDatabase) {
  int64_t trial_id = 0;
  {
    Store store = Store::open(path_);
    SweepStore sweeps(store.db());
    TrialRecord trial = full_trial(sweeps.create_sweep(make_sweep("s")), "k");
    sweeps.begin_trial(trial);
    trial_id = trial.id;
  }
  const pid_t child = fork();
  ASSERT_NE(child, -1);
  if (child == 0) {
    // The child writes half of a trial's result and is killed before COMMIT.
    try {
      Store store = Store::open(path_);
      store.db().transaction([&] {
        store.db().exec("UPDATE trials SET status = 'ok', exit_code = 0");
        for (int step = 1; step <= 100; ++step) {
          store.db().exec("INSERT INTO trial_steps (trial_id, step, loss) VALUES (" +
                          std::to_string(trial_id) + ", " + std::to_string(step) + ", 1.0)");
        }
        raise(SIGKILL);
      });
    } catch (...) {
    }
    _exit(1);  // reached only when the writes failed before the kill
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;

  Store store = Store::open(path_);
  expect_integrity_ok(store.db());
  SweepStore sweeps(store.db());
  EXPECT_EQ(sweeps.trial(trial_id)->status, "running");
  EXPECT_TRUE(sweeps.trial_steps(trial_id).empty());
  // ... and the sweep can go on: the trial is re-run and finished.
  TrialRecord rerun = *sweeps.trial(trial_id);
  sweeps.begin_trial(rerun);
  rerun.status = "ok";
  rerun.exit_code = 0;
  sweeps.finish_trial(rerun, {{1, 1.0, 1.0, 1.0, 1.0, 1}}, {});
  EXPECT_EQ(sweeps.trial(trial_id)->status, "ok");
  EXPECT_EQ(sweeps.trial_steps(trial_id).size(), 1u);
  expect_integrity_ok(store.db());
}

}  // namespace
}  // namespace ulysses::store
