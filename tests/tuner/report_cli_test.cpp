// `ulysses-tune report` errors and edge cases (exit status 2, one line, no report directory and
// no database left behind; no ok trials; no gnuplot; replacing a report), and `list` / `show`.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/output_dir.h"
#include "comm/exit_status.h"
#include "common/error.h"
#include "tests/tuner/report_test_util.h"
#include "tuner/report/list_show_command.h"
#include "tuner/report/plots.h"
#include "tuner/report/report_command.h"
#include "tuner/report/trial_table.h"
#include "tuner/results/format.h"
#include "tuner/results/memory_basis.h"

namespace fs = std::filesystem;

namespace ulysses::report {
namespace {

using testing::ReportFixture;

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

// Runs fn as main does; expects exit status 2 and a one-line error that contains `needle`.
void expect_usage_error(const std::function<int()>& fn, const std::string& needle) {
  ::testing::internal::CaptureStderr();
  const int status = comm::run_with_exit_status(fn);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, kExitUsage) << err;
  EXPECT_EQ(err.find('\n'), err.size() - 1) << "not one line: " << err;
  EXPECT_EQ(err.rfind("error: ", 0), 0u) << err;
  EXPECT_NE(err.find(needle), std::string::npos) << err;
}

TEST_F(ReportFixture, ErrorsAreOneLineAndLeaveNothingBehind) {
  const fs::path reports = dir_ / "reports";
  fs::create_directories(reports);
  ReportOptions missing = options(reports / "x");
  missing.db_path = (dir_ / "nope.db").string();
  expect_usage_error([&] { return run_report(missing); }, missing.db_path + ": no such file");
  EXPECT_FALSE(fs::exists(missing.db_path));  // not created

  const fs::path junk = dir_ / "junk.db";
  std::ofstream(junk) << std::string(4096, 'j');
  ReportOptions corrupt = options(reports / "x");
  corrupt.db_path = junk.string();
  expect_usage_error([&] { return run_report(corrupt); }, junk.string() + ": ");

  ReportOptions unknown = options(reports / "x");
  unknown.sweep = "no-such-sweep";
  expect_usage_error([&] { return run_report(unknown); },
                     "--sweep no-such-sweep: no such sweep in " + db_path_ + " (has: synthetic)");

  ReportOptions bad_gnuplot = options(reports / "x");
  bad_gnuplot.gnuplot = (dir_ / "no-gnuplot").string();
  expect_usage_error([&] { return run_report(bad_gnuplot); }, "--gnuplot ");

  // gnuplot that fails: an error (status 1), and the temporary directory is gone.
  ReportOptions failing = options(reports / "x");
  failing.gnuplot = "/bin/false";
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(comm::run_with_exit_status([&] { return run_report(failing); }), kExitFailure);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("gnuplot: /bin/false exited"),
            std::string::npos);

  EXPECT_TRUE(entries(reports).empty()) << entries(reports).front();  // no report, no temp dir

  // A directory that is not a report is never replaced.
  fs::create_directories(reports / "mine");
  std::ofstream(reports / "mine" / "notes.txt") << "keep";
  expect_usage_error([&] { return run_report(options(reports / "mine")); },
                     "was not written by ulysses-tune report");
  EXPECT_EQ(entries(reports / "mine"), std::vector<std::string>{"notes.txt"});
}

TEST_F(ReportFixture, AnEarlierReportIsReplacedWhole) {
  const fs::path out = dir_ / "reports" / "synthetic";
  ASSERT_EQ(run_report(options(out)), 0);
  // An earlier report that also drew stale.png (its marker lists what it wrote).
  std::ofstream(out / "README.md") << "old report";
  std::ofstream(out / "stale.png") << "old plot";
  std::ofstream(out / kOutputMarker, std::ios::app) << "stale.png\n";
  ReportOptions o = options(dir_ / "reports" / "synthetic/");  // trailing separator
  o.sweep = "";                                                // the latest sweep
  ASSERT_EQ(run_report(o), 0);
  EXPECT_FALSE(fs::exists(out / "stale.png"));
  EXPECT_NE(read(out / "README.md").find("# Sweep `synthetic`"), std::string::npos);
  // A file of the user's in it: the report is not replaced.
  std::ofstream(out / "notes.txt") << "keep";
  expect_usage_error([&] { return run_report(o); }, "holds notes.txt");
  EXPECT_EQ(read(out / "notes.txt"), "keep");
  EXPECT_EQ(entries(dir_ / "reports"), std::vector<std::string>{"synthetic"});
}

TEST_F(ReportFixture, WithoutGnuplotTheReportSaysHowToDrawThePlots) {
  const char* saved = getenv("GNUPLOT");
  const std::string saved_value = saved ? saved : "";
  setenv("GNUPLOT", "/nonexistent/gnuplot", 1);
  const fs::path out = dir_ / "report";
  const int status = run_report(options(out));
  saved ? setenv("GNUPLOT", saved_value.c_str(), 1) : unsetenv("GNUPLOT");
  ASSERT_EQ(status, 0);
  const std::string readme = read(out / "README.md");
  EXPECT_NE(readme.find("Not drawn: gnuplot was not found"), std::string::npos);
  EXPECT_EQ(readme.find("](throughput_vs_seqlen.png)"), std::string::npos);
  for (const char* file : {"plots.gp", "throughput.dat", "memory.dat", "phases.dat", "pareto.dat"})
    EXPECT_TRUE(fs::is_regular_file(out / file)) << file;
  EXPECT_FALSE(fs::exists(out / "pareto_front.png"));
}

TEST_F(ReportFixture, ASweepWithoutOkTrialsOmitsThePlotsThatNeedThem) {
  {
    store::Store store = store::Store::open(db_path_);
    store::SweepStore sweeps(store.db());
    store::SweepRecord sweep;
    sweep.name = "all-failed";
    sweep.id = sweeps.create_sweep(sweep);
    add("X", sweeps, sweep.id, 1, 2, 4096, "oom", 0,
        [](store::TrialRecord& t) { t.exit_code = 12; });
    add("Y", sweeps, sweep.id, 1, 2, 8192, "pruned", 0);
  }
  const fs::path out = dir_ / "failed";
  ReportOptions o = options(out);
  o.sweep = "";  // the latest: all-failed
  ASSERT_EQ(run_report(o), 0);
  const std::string readme = read(out / "README.md");
  EXPECT_NE(readme.find("# Sweep `all-failed`"), std::string::npos);
  EXPECT_EQ(readme.find("](throughput_vs_seqlen.png)"), std::string::npos);
  EXPECT_EQ(readme.find("](pareto_front.png)"), std::string::npos);
  EXPECT_EQ(readme.find("](time_breakdown.png)"), std::string::npos);
  size_t said = 0;
  for (size_t at = readme.find("Not drawn: no trial was measured"); at != std::string::npos;
       at = readme.find("Not drawn: no trial was measured", at + 1)) {
    ++said;
  }
  EXPECT_EQ(said, 3u);
  if (find_gnuplot("")) {  // the OOM under its 8 GiB limit is still worth a memory plot
    EXPECT_NE(readme.find("](memory_vs_seqlen.png)"), std::string::npos);
    EXPECT_TRUE(fs::is_regular_file(out / "memory_vs_seqlen.png"));
  }
  EXPECT_FALSE(fs::exists(out / "throughput_vs_seqlen.png"));
  EXPECT_NE(readme.find("| 1x2 | 2 | 0 | - |"), std::string::npos);
}

TEST_F(ReportFixture, ListShowsSweepsAndTrials) {
  std::ostringstream sweeps_out;
  ListOptions list;
  list.db_path = db_path_;
  ASSERT_EQ(run_list(list, sweeps_out), 0);
  const std::string text = sweeps_out.str();
  EXPECT_NE(text.find("name"), std::string::npos);
  EXPECT_NE(text.find("synthetic"), std::string::npos);
  EXPECT_NE(text.find("finished"), std::string::npos);
  // The best trial is the one the sweep's objective (max-seqlen) picks: C at 4096 tokens, not
  // the fastest trial (D at 1024).
  EXPECT_NE(text.find("  max-seqlen  " + std::to_string(id("C")) +
                      ": 4096 tokens, 700.0 tokens/s per rank\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("1100.0"), std::string::npos) << text;
  // Header: id name created status trials ok oom timeout pruned invalid best...; row counts.
  EXPECT_NE(text.find("  11   7    1        1       1        1"), std::string::npos) << text;

  std::ostringstream trials_out;
  list.sweep = "synthetic";
  ASSERT_EQ(run_list(list, trials_out), 0);
  const std::string trials = trials_out.str();
  EXPECT_EQ(trials.rfind("sweep synthetic (id ", 0), 0u) << trials;
  for (const auto& t : trials_) {
    EXPECT_NE(trials.find("\n" + std::string(t.id < 10 ? " " : "") + std::to_string(t.id) + "  "),
              std::string::npos)
        << "trial " << t.id << "\n"
        << trials;
  }
  // Peaks above the start-up baseline, which is stated under the table: A's 0.25 GiB of resident
  // set is about 0.13 GiB above the CPU baseline, shown in MiB (under 1 GiB) with its unit. On
  // CPU that is RSS, and the address space the limit caps has a column of its own.
  const size_t header = trials.find("RSS above baseline  address space above baseline  ");
  ASSERT_NE(header, std::string::npos) << trials;
  EXPECT_LT(trials.find(" limit", header), trials.find('\n', header)) << trials;
  const auto a = std::find_if(trials_.begin(), trials_.end(),
                              [&](const store::TrialRecord& t) { return t.id == id("A"); });
  ASSERT_NE(a, trials_.end());
  const std::string a_peak = memory_size(peak_above_baseline(*a));
  ASSERT_NE(a_peak.find(" MiB"), std::string::npos) << a_peak;
  const size_t a_row = trials.find("1000.0    100.0");
  ASSERT_NE(a_row, std::string::npos) << trials;
  const std::string a_line = trials.substr(a_row, trials.find('\n', a_row) - a_row);
  EXPECT_NE(a_line.find(" " + a_peak + "  "), std::string::npos) << a_line;
  EXPECT_NE(a_line.find(" 8.00 GiB"), std::string::npos) << a_line;
  EXPECT_NE(trials.find("\nPeak memory is per rank and above the rank's start-up baseline"),
            std::string::npos)
      << trials;
    // Long cells are cut to 60 characters, line breaks shown as spaces.
  EXPECT_NE(trials.find("  out of memory: \"CUDA\", tried to allocate 2.00 GiB, at lay...\n"),
            std::string::npos)
      << trials;

  list.sweep = "nope";
  expect_usage_error([&] { return run_list(list); }, "--sweep nope: no such sweep");
  list.db_path = (dir_ / "absent.db").string();
  list.sweep = "";
  expect_usage_error([&] { return run_list(list); }, "absent.db: no such file");
  EXPECT_FALSE(fs::exists(list.db_path));

  // A store without sweeps (schema version 1 or none run yet): an empty list, not an error.
  const std::string empty = (dir_ / "empty.db").string();
  store::Store::open(empty);
  std::ostringstream none;
  list.db_path = empty;
  ASSERT_EQ(run_list(list, none), 0);
  EXPECT_EQ(none.str(), empty + ": no sweeps\n");
}

TEST_F(ReportFixture, ShowPrintsATrialOrASweepInFull) {
  std::ostringstream out;
  ShowOptions show;
  show.db_path = db_path_;
  show.trial_id = id("H");
  ASSERT_EQ(run_show(show, out), 0);
  const std::string text = out.str();
  EXPECT_EQ(text.rfind("trial " + std::to_string(id("H")) + " of sweep synthetic\n", 0), 0u);
  for (const auto& [name, value] : trial_fields(trials_[6])) {
    EXPECT_TRUE(text.find("\n" + name + ": ") != std::string::npos ||
                text.find("\n" + name + ":\n") != std::string::npos)
        << name;
  }
  EXPECT_NE(
      text.find(
          "error:\n    out of memory: \"CUDA\", tried to allocate 2.00 GiB,\n    at layer 3\n"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("run dir: runs/synthetic/H"), std::string::npos);
  EXPECT_NE(text.find("\npeak: RSS " +
                      memory_size((int64_t{9} << 30) - memory_baseline_bytes("cpu")) +
                      " above its start-up RSS; the per-rank limit of 8.00 "
                      "GiB caps address space, which it did not record; peak_mem_bytes 9.00 GiB "
                      "above the start-up baseline " +
                      memory_size(memory_baseline_bytes("cpu")) + " (estimated)\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\nmesh: 1x2\n"), std::string::npos) << text;

  std::ostringstream ok_out;
  show.trial_id = id("A");
  ASSERT_EQ(run_show(show, ok_out), 0);
  EXPECT_NE(ok_out.str().find("compute_ms         50.000"), std::string::npos) << ok_out.str();
  EXPECT_NE(ok_out.str().find("   2  6.7500"), std::string::npos) << ok_out.str();
  EXPECT_NE(ok_out.str().find("RSS above baseline"), std::string::npos) << ok_out.str();
  // A's step time was predicted by the uncalibrated model: no fit is in the database.
  EXPECT_NE(ok_out.str().find("\npredicted step: 160.0 ms (uncalibrated: "), std::string::npos)
      << ok_out.str();

  std::ostringstream sweep_out;
  show.trial_id = 0;
  show.sweep = "synthetic";
  ASSERT_EQ(run_show(show, sweep_out), 0);
  const std::string sweep = sweep_out.str();
  EXPECT_NE(sweep.find("status: finished"), std::string::npos);
  EXPECT_NE(sweep.find("trials: 11: ok 7, oom 1, timeout 1, pruned 1, invalid 1"),
            std::string::npos);
  EXPECT_NE(sweep.find("\nhost                  node-7\n"), std::string::npos) << sweep;
  EXPECT_NE(sweep.find("fraction of the grid run"), std::string::npos);
  // The best trial is the objective's (max-seqlen): C.
  const size_t best = sweep.find("\nbest trial (objective max-seqlen)  ");
  ASSERT_NE(best, std::string::npos) << sweep;
  const std::string best_line = sweep.substr(best + 1, sweep.find('\n', best + 1) - best - 1);
  const std::string c = "  trial " + std::to_string(id("C")) +
                        ": dp=1 sp=2 tiled_mlp=1, seqlen 4096, 700.0 tokens/s per rank";
  EXPECT_EQ(best_line.substr(best_line.size() - std::min(best_line.size(), c.size())), c)
      << sweep;
  EXPECT_NE(sweep.find("experiment_yaml:\n    name: synthetic\n"), std::string::npos);

  show.sweep = "";
  show.trial_id = 999;
  expect_usage_error([&] { return run_show(show); }, "--trial 999: no such trial in " + db_path_);
  show.sweep = "synthetic";
  expect_usage_error([&] { return run_show(show); },
                     "show: give one of --trial ID and --sweep NAME");
}

}  // namespace
}  // namespace ulysses::report
