// Nothing of the user's is ever deleted: every ulysses-tune command that writes a directory or a
// file (recommend, report, export, plan --out, sweep's trial directories) replaces only what it
// wrote itself, refuses `.`, the database's directory and a user's directory with one line, and
// leaves the database and the user's files byte-identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "common/error.h"
#include "common/output_dir.h"
#include "tuner/sweep_cli_fixture.h"

namespace ulysses::sweep {
namespace {

// Every file under `dir` but SQLite's -wal/-shm companions (a reader may create those).
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files = testing::snapshot_files(dir);
  for (auto it = files.begin(); it != files.end();) {
    const std::string& name = it->first;
    const bool companion = name.size() > 4 && (name.compare(name.size() - 4, 4, "-wal") == 0 ||
                                               name.compare(name.size() - 4, 4, "-shm") == 0);
    it = companion ? files.erase(it) : std::next(it);
  }
  return files;
}

void expect_refused(const Result& r, const std::string& needle) {
  EXPECT_EQ(r.status, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

class OutputSafetyTest : public SweepCliTest {
 protected:
  void SetUp() override {
    SweepCliTest::SetUp();
    // The fixture's sweep over lengths up to 4096 (a few dozen fake trials, not a hundred): these
    // tests need a finished sweep with trials, not its search.
    std::string text = read_text(experiment_);
    const std::string lengths = "to: 32768";
    ASSERT_NE(text.find(lengths), std::string::npos);
    text.replace(text.find(lengths), lengths.size(), "to: 4096");
    std::ofstream(experiment_) << text;
    Result r = tune(sweep_args());
    ASSERT_EQ(r.status, 0) << r.out << r.err;
  }
  std::string recommend(const fs::path& out, const std::string& cd = "") {
    return (cd.empty() ? "" : "cd '" + cd + "' && ") + std::string("'") + tune_ +
           "' recommend --db '" + db_ + "' --out '" + out.string() + "'";
  }
};

TEST_F(OutputSafetyTest, RecommendRefusesTheWorkingDirectory) {
  std::ofstream(dir_ / "notes.txt") << "mine";
  const auto before = snapshot(dir_);
  expect_refused(shell(recommend(".", dir_.string())), "--out .: is the working directory");
  // the captured output files are the only change
  auto after = snapshot(dir_);
  after.erase("out"), after.erase("err");
  auto expected = before;
  expected.erase("out"), expected.erase("err");
  EXPECT_TRUE(after == expected) << "files under the working directory changed";
  // an ancestor of the working directory too
  fs::create_directories(dir_ / "deep/er");
  expect_refused(shell(recommend(dir_ / "deep", (dir_ / "deep/er").string())),
                 "is the working directory or holds it");
}

TEST_F(OutputSafetyTest, RecommendRefusesTheDatabasesDirectory) {
  fs::create_directories(dir_ / "sweep");
  fs::copy_file(db_, dir_ / "sweep/results.db");
  db_ = (dir_ / "sweep/results.db").string();
  const auto before = snapshot(dir_ / "sweep");
  expect_refused(tune("recommend --db '" + db_ + "' --out '" + (dir_ / "sweep").string() + "'"),
                 "holds " + db_);
  EXPECT_TRUE(snapshot(dir_ / "sweep") == before) << "the database's directory changed";
}

TEST_F(OutputSafetyTest, RecommendRefusesAUsersDirectoryAndReplacesOnlyItsOwn) {
  const fs::path mine = dir_ / "mywork";
  fs::create_directories(mine / "sub");
  std::ofstream(mine / "plan.txt") << "my plan";
  std::ofstream(mine / "sub/data.bin") << std::string("\0\1\2", 3);
  const auto before = snapshot(mine);
  expect_refused(shell(recommend(mine)), "was not written by ulysses-tune recommend");
  EXPECT_EQ(snapshot(mine), before);

  // Its own earlier output is replaced (twice, so the marker survives a replacement) ...
  const fs::path rec = dir_ / "rec";
  for (int i = 0; i < 2; ++i) {
    const Result r = shell(recommend(rec));
    ASSERT_EQ(r.status, 0) << r.out << r.err;
  }
  EXPECT_TRUE(fs::exists(rec / "WHY.md"));
  EXPECT_TRUE(fs::exists(rec / kOutputMarker));
  // ... until the user puts a file of their own into it.
  std::ofstream(rec / "my-notes.md") << "keep me";
  const auto with_notes = snapshot(rec);
  expect_refused(shell(recommend(rec)), "holds my-notes.md, which ulysses-tune recommend did not");
  EXPECT_EQ(snapshot(rec), with_notes);
  // Another command's output is not recommend's to replace.
  ASSERT_EQ(tune("report --db '" + db_ + "' --out '" + (dir_ / "rep").string() + "'").status, 0);
  expect_refused(shell(recommend(dir_ / "rep")), "was not written by ulysses-tune recommend");
  EXPECT_TRUE(fs::exists(dir_ / "rep/README.md"));
  // Nothing is left beside the outputs.
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
    EXPECT_EQ(entry.path().filename().string().find(".old-"), std::string::npos) << entry.path();
  }
}

TEST_F(OutputSafetyTest, ReportRefusesAProjectFolderThatHoldsAReadme) {
  const fs::path project = dir_ / "project";
  fs::create_directories(project);
  std::ofstream(project / "README.md") << "# my project";
  std::ofstream(project / "train.py") << "print('hi')";
  const auto before = snapshot(project);
  expect_refused(tune("report --db '" + db_ + "' --out '" + project.string() + "'"),
                 "was not written by ulysses-tune report");
  EXPECT_EQ(snapshot(project), before);
  // its own report is replaced, and the database is never touched
  const std::string db_bytes = read_text(db_);
  ASSERT_EQ(tune("report --db '" + db_ + "' --out '" + (dir_ / "rep").string() + "'").status, 0);
  ASSERT_EQ(tune("report --db '" + db_ + "' --out '" + (dir_ / "rep").string() + "'").status, 0);
  EXPECT_TRUE(fs::exists(dir_ / "rep/README.md"));
  EXPECT_EQ(read_text(db_), db_bytes);
}

TEST_F(OutputSafetyTest, ExportAndPlanReplaceAFileOnlyWithForceAndNeverTheDatabase) {
  const std::string db_bytes = read_text(db_);
  const fs::path file = dir_ / "ds_config.json";
  std::ofstream(file) << "my own config";
  expect_refused(tune("export --db '" + db_ + "' --trial 1 --format deepspeed --out '" +
                      file.string() + "'"),
                 "exists; choose a new file name or pass --force");
  EXPECT_EQ(read_text(file), "my own config");
  ASSERT_EQ(tune("export --db '" + db_ + "' --trial 1 --format deepspeed --force --out '" +
                 file.string() + "'").status,
            0);
  EXPECT_NE(read_text(file).find("train_micro_batch_size_per_gpu"), std::string::npos);
  expect_refused(tune("export --db '" + db_ + "' --trial 1 --format native --force --out '" +
                      db_ + "'"),
                 "must not replace");
  EXPECT_EQ(read_text(db_), db_bytes);

  // plan --fit --out: refused before the calibration is stored
  std::ofstream(dir_ / "fit.json") << "mine";
  expect_refused(tune("plan --fit '" + db_ + "' --out '" + (dir_ / "fit.json").string() + "'"),
                 "--out " + (dir_ / "fit.json").string() + ": exists");
  EXPECT_EQ(read_text(db_), db_bytes);
  EXPECT_EQ(read_text(dir_ / "fit.json"), "mine");
}

TEST_F(OutputSafetyTest, SweepWritesTrialDirectoriesOnlyIntoItsOwn) {
  // A second database beside the first, same sweep name: the default runs directory is taken.
  const auto runs_before = snapshot(dir_ / "runs");
  ASSERT_FALSE(runs_before.empty());
  const std::string other_db = (dir_ / "other.db").string();
  expect_refused(tune("sweep '" + experiment_ + "' --db '" + other_db + "' --trainer '" + fake_ +
                      "' --max-trials 2"),
                 "belongs to sweep 'fake' of " + db_);
  EXPECT_FALSE(fs::exists(other_db));  // nothing half-written
  EXPECT_EQ(snapshot(dir_ / "runs"), runs_before);

  // A user's directory as --runs-dir.
  fs::create_directories(dir_ / "mine");
  std::ofstream(dir_ / "mine/1") << "not a trial";
  expect_refused(tune("sweep '" + experiment_ + "' --db '" + other_db + "' --trainer '" + fake_ +
                      "' --max-trials 2 --runs-dir '" + (dir_ / "mine").string() + "'"),
                 "was not written by ulysses-tune sweep");
  EXPECT_EQ(read_text(dir_ / "mine/1"), "not a trial");
  EXPECT_FALSE(fs::exists(other_db));

  // The same sweep resumed uses its own directory.
  EXPECT_EQ(tune(sweep_args("--resume")).status, 0);
}

// An exported configuration runs in a directory of its own: launching it leaves the trial's
// measurements as they were, and launch refuses an output.dir (or checkpoint.dir) inside a
// sweep's trial runs.
TEST_F(OutputSafetyTest, ExportedConfigsGetTheirOwnOutputAndLaunchNeverWritesIntoTrialRuns) {
  const Result exported = tune("export --db '" + db_ + "' --trial 1 --format native --out '" +
                               (dir_ / "trial1.yaml").string() + "'");
  ASSERT_EQ(exported.status, 0) << exported.err;
  const std::string yaml = read_text(dir_ / "trial1.yaml");
  EXPECT_NE(yaml.find("dir: runs/fake-trial-1"), std::string::npos) << yaml;
  EXPECT_EQ(yaml.find((dir_ / "runs").string()), std::string::npos) << yaml;

  const auto runs_before = snapshot(dir_ / "runs" / "fake");
  ASSERT_FALSE(runs_before.empty());
  const Result launched = shell("cd '" + dir_.string() + "' && '" + tune_ +
                                "' launch trial1.yaml --nproc 4 --trainer '" + fake_ + "'");
  EXPECT_EQ(launched.status, 0) << launched.out << launched.err;
  EXPECT_TRUE(fs::exists(dir_ / "runs" / "fake-trial-1" / "metrics.jsonl"));
  EXPECT_EQ(snapshot(dir_ / "runs" / "fake"), runs_before);

  // The trial's own output directory (and anything under the sweep's runs) is refused.
  const std::string trial_out = (dir_ / "runs" / "fake" / "1" / "out").string();
  expect_refused(shell("cd '" + dir_.string() + "' && '" + tune_ +
                       "' launch trial1.yaml --nproc 4 --trainer '" + fake_ +
                       "' --set output.dir=" + trial_out),
                 "output.dir " + trial_out + ": is inside " + (dir_ / "runs" / "fake").string());
  expect_refused(shell("cd '" + dir_.string() + "' && '" + tune_ +
                       "' launch trial1.yaml --nproc 4 --trainer '" + fake_ +
                       "' --set checkpoint.dir=runs/fake/ckpt"),
                 "checkpoint.dir runs/fake/ckpt: is inside");
  EXPECT_EQ(snapshot(dir_ / "runs" / "fake"), runs_before);
}

TEST_F(OutputSafetyTest, SubmitWithoutSbatchAndResumeOfAnUnknownNameWriteNothing) {
  const std::string other_db = (dir_ / "submit.db").string();
  expect_refused(tune("sweep '" + experiment_ + "' --db '" + other_db + "' --trainer '" + fake_ +
                          "' --runner srun --submit",
                      "PATH=/nonexistent"),
                 "--submit: sbatch is not on PATH");
  EXPECT_FALSE(fs::exists(other_db));
  // --resume of a name the database does not hold names the ones it holds.
  expect_refused(tune(sweep_args("--resume --name fake-grid")), "its sweeps: fake");
}

// The staging rule on its own: a write that fails before commit() leaves the old output whole.
TEST(StagedOutputDir, AnAbandonedWriteLeavesTheEarlierOutputWhole) {
  testing::TempDir tmp("staged-output");
  const fs::path out = tmp.path() / "out";
  const OutputOwner owner{"--out", "test writer", {}};
  {
    StagedOutputDir staged(out, owner);
    std::ofstream(staged.staging() / "a.txt") << "first";
    staged.commit();
  }
  {
    StagedOutputDir staged(out, owner);
    std::ofstream(staged.staging() / "a.txt") << "second, never committed";
  }  // e.g. an exception before commit()
  EXPECT_EQ(read_text(out / "a.txt"), "first");
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(tmp.path())) ++entries;
  EXPECT_EQ(entries, 1u);  // no staging directory left
  // A file that is not a directory, and a symbolic link, are refused.
  std::ofstream(tmp.path() / "file") << "x";
  EXPECT_THROW(StagedOutputDir(tmp.path() / "file", owner), UserError);
  fs::create_directory_symlink(out, tmp.path() / "link");
  EXPECT_THROW(StagedOutputDir(tmp.path() / "link", owner), UserError);
  EXPECT_EQ(read_text(out / "a.txt"), "first");
}

}  // namespace
}  // namespace ulysses::sweep
