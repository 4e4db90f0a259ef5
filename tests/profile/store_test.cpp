// The results database (tuner/store): schema version and migrations, WAL, transactions that
// leave nothing behind when they fail, calibration and profile records, and one-line errors
// for corrupt or too-new files.
#include "tuner/store/store.h"
#include "tuner/store/sweep_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "tuner/store/migrations.h"
#include "common/remove_tree.h"

namespace fs = std::filesystem;

namespace ulysses::store {
namespace {

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("store-test-" + std::to_string(getpid()));
    ulysses::remove_tree(dir_);
    path_ = (dir_ / "sub" / "results.db").string();  // the parent is created on open
  }
  void TearDown() override { ulysses::remove_tree(dir_); }

  std::string expect_user_error(const std::function<void()>& fn) {
    try {
      fn();
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "no UserError";
    return "";
  }

  fs::path dir_;
  std::string path_;
};

TEST_F(StoreTest, NewStoreHasTheLatestSchemaInWalMode) {
  Store store = Store::open(path_);
  EXPECT_EQ(store.schema_version(), latest_schema_version());
  EXPECT_EQ(store.db().journal_mode(), "wal");
  for (const char* table : {"calibration_runs", "calibrations", "profiles"})
    EXPECT_TRUE(store.db().has_table(table)) << table;
  Statement check = store.db().prepare("PRAGMA integrity_check");
  ASSERT_TRUE(check.step());
  EXPECT_EQ(check.column_text(0), "ok");
}

TEST_F(StoreTest, ReopeningAppliesNothingTwice) {
  { Store::open(path_); }
  Database db = Database::open(path_);
  EXPECT_EQ(migrate(db), 0);
  EXPECT_EQ(db.user_version(), latest_schema_version());
}

TEST_F(StoreTest, MigrationsAreNumberedWithoutGaps) {
  int expected = 1;
  for (const Migration& m : migrations()) EXPECT_EQ(m.version, expected++) << m.description;
}

TEST_F(StoreTest, CalibrationRunRoundTrips) {
  Store store = Store::open(path_);
  CalibrationRun run;
  run.hardware = "cpu-local";
  run.host = "box";
  run.device = "cpu";
  run.world_size = 2;
  run.command = "ulysses-bench --x";
  std::vector<Calibration> rows(2);
  rows[0].benchmark = "AllToAll/bytes:1024/ranks:2";
  rows[0].metric = "busbw_GBps";
  rows[0].value = 1.5;
  rows[0].unit = "GB/s";
  rows[0].params = R"({"bytes":"1024","ranks":"2"})";
  rows[1].benchmark = "Gemm/op:q_proj";
  rows[1].metric = "tflops";
  rows[1].value = 0.02;
  rows[1].unit = "TFLOP/s";
  const int64_t id = store.add_calibration_run(run, rows);
  const auto runs = store.calibration_runs();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].id, id);
  EXPECT_EQ(runs[0].hardware, "cpu-local");
  EXPECT_EQ(runs[0].world_size, 2);
  EXPECT_FALSE(runs[0].created_at.empty());
  const auto back = store.calibrations(id);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].metric, "busbw_GBps");
  EXPECT_DOUBLE_EQ(back[0].value, 1.5);
  EXPECT_EQ(back[0].params, rows[0].params);
  EXPECT_EQ(back[1].params, "{}");
}

TEST_F(StoreTest, FailedTransactionLeavesNothing) {
  Store store = Store::open(path_);
  EXPECT_THROW(store.db().transaction([&] {
    store.db().exec(
        "INSERT INTO calibration_runs (hardware, host, device, world_size, command) "
        "VALUES ('h', 'x', 'cpu', 1, 'c')");
    throw std::runtime_error("killed halfway");
  }),
               std::runtime_error);
  EXPECT_TRUE(store.calibration_runs().empty());
  // A row that breaks a constraint rolls back its whole run.
  std::vector<Calibration> rows(1);
  rows[0].benchmark = "b";
  rows[0].metric = "m";
  rows[0].unit = "u";
  rows[0].params = "{}";
  store.db().exec(
      "CREATE TRIGGER no_m BEFORE INSERT ON calibrations WHEN NEW.metric = 'm' "
      "BEGIN SELECT RAISE(ABORT, 'refused'); END");
  EXPECT_THROW(store.add_calibration_run(CalibrationRun{}, rows), UserError);
  EXPECT_TRUE(store.calibration_runs().empty());
}

TEST_F(StoreTest, ProfileRoundTrips) {
  Store store = Store::open(path_);
  ProfileRecord r;
  r.trial_id = 7;
  r.devices = 2;
  r.steps = 4;
  r.comm_ms = 17;
  r.compute_ms = 27;
  r.overlap_ms = 4;
  r.exposed_comm_ms = 13;
  r.details = "[]";
  store.add_profile(r);
  ProfileRecord no_trial;
  store.add_profile(no_trial);
  const auto back = store.profiles();
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].trial_id, std::optional<int64_t>(7));
  EXPECT_DOUBLE_EQ(back[0].exposed_comm_ms, 13.0);
  EXPECT_EQ(back[0].details, "[]");
  EXPECT_FALSE(back[1].trial_id.has_value());
}

// `profile --trial ID` re-runs a stored trial's run config (schema 2's trials table).
TEST_F(StoreTest, TrialConfigComesFromTheTrialsTable) {
  Store store = Store::open(path_);
  EXPECT_FALSE(store.trial_config_yaml(1).has_value());
  SweepStore sweeps(store.db());
  SweepRecord sweep;
  sweep.name = "s";
  const int64_t sweep_id = sweeps.create_sweep(sweep);
  TrialRecord trial;
  trial.sweep_id = sweep_id;
  trial.key = "mesh.sp=2 L=64";
  trial.seqlen = 64;
  trial.config_yaml = "mesh: {sp: 2}";
  sweeps.begin_trial(trial);
  EXPECT_EQ(store.trial_config_yaml(trial.id), std::optional<std::string>("mesh: {sp: 2}"));
  EXPECT_FALSE(store.trial_config_yaml(trial.id + 1).has_value());
}

TEST_F(StoreTest, CorruptFileIsAOneLineErrorNamingIt) {
  fs::create_directories(dir_);
  const std::string junk = (dir_ / "junk.db").string();
  std::ofstream(junk) << std::string(8192, 'j');
  const std::string what = expect_user_error([&] { Store::open(junk); });
  EXPECT_EQ(what.rfind(junk + ": ", 0), 0u) << what;
}

TEST_F(StoreTest, NewerSchemaIsRefused) {
  {
    Database db = Database::open(path_);
    db.exec("PRAGMA user_version = 99");
  }
  const std::string what = expect_user_error([&] { Store::open(path_); });
  EXPECT_NE(what.find("schema version 99 is newer"), std::string::npos) << what;
}

}  // namespace
}  // namespace ulysses::store
