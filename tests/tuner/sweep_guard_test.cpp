// What keeps a sweep's results honest and its outputs safe, through the ulysses-tune binary with
// the fake trainer (sweep_cli_fixture.h): --resume refuses an experiment that changed in anything
// that decides trial results (naming the key) and accepts a budget change; sweep names that would
// leave runs/ or break a generated script are refused before anything is written. And the
// recommendation's tie rule: two configurations whose tokens/s differ by less than the spread of
// their measured steps are tied, and WHY.md's table says so.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "tuner/recommend/ranking.h"
#include "tuner/sweep_cli_fixture.h"

namespace ulysses::sweep {
namespace {

// The fixture's experiment with `from` replaced by `to`, written over the experiment file.
void rewrite(const std::string& path, const std::string& from, const std::string& to) {
  std::string text = read_text(path);
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  std::ofstream(path) << text;
}

// stderr holds exactly one line, "error: <what>".
void expect_one_error_line(const Result& r) {
  EXPECT_EQ(r.status, 2) << r.out << r.err;
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// The sweep fixture under its own suite name (ctest runs each suite as one test).
class SweepGuardTest : public SweepCliTest {};

int64_t ran(const std::vector<store::TrialRecord>& trials) {
  int64_t n = 0;
  for (const auto& t : trials) n += t.ran();
  return n;
}

TEST_F(SweepGuardTest, ResumeRefusesAChangedExperimentNamingTheKey) {
  // The hardware profile beside the experiment, so that the test can change its contents.
  const std::string profile = (dir_ / "hw.yaml").string();
  std::ofstream(profile) << read_text(fs::path(project_home()) /
                                     "profiles/hardware/cpu-local.yaml");
  rewrite(experiment_, "hardware: cpu-local", "hardware: hw.yaml");
  Result first = tune(sweep_args("--max-trials 2"));
  ASSERT_EQ(first.status, 0) << first.out << first.err;
  const int64_t runs = ran(trials("fake"));
  ASSERT_EQ(runs, 2);
  const std::string experiment = read_text(experiment_);

  struct Change {
    std::string from, to, key;
  };
  const Change changes[] = {
      {"trial: {warmup_steps: 1, steps: 2}", "trial: {warmup_steps: 1, steps: 3}", "trial.steps"},
      {"memory_limit_gib: 1.0", "memory_limit_gib: 2.0", "memory_limit_gib"},
      {"headroom: 0.1", "headroom: 0.2", "headroom"},
      {"train: {device: cpu, steps: 5}",
       "train: {device: cpu, steps: 5}\n  memory: {checkpointing: true}",
       "base.memory.checkpointing"},
      {"num_layers: 1", "num_layers: 2", "base.model.num_layers"},
      // Trials set their own steps, but the base is what the sweep was started with.
      {"train: {device: cpu, steps: 5}", "train: {device: cpu, steps: 6}", "base.train.steps"},
      {"memory.tiled_loss: [1, 8]", "memory.tiled_loss: [1, 4]", "space.memory.tiled_loss"},
      {"to: 32768", "to: 16384", "space.sequence.length"},
      {"trial_timeout_s: 30", "trial_timeout_s: 60", "budget.trial_timeout_s"},
  };
  for (const Change& change : changes) {
    SCOPED_TRACE(change.key);
    std::ofstream(experiment_) << experiment;
    rewrite(experiment_, change.from, change.to);
    const Result r = tune(sweep_args("--resume"));
    expect_one_error_line(r);
    EXPECT_EQ(r.err.rfind("error: --resume: " + change.key + " changed", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(" since sweep 'fake' started; resume with the experiment it started "
                         "with (only budget.max_trials and budget.wall_clock_s may change)"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(ran(trials("fake")), runs);  // nothing ran
  }

  // The refusal names the key and both values.
  std::ofstream(experiment_) << experiment;
  rewrite(experiment_, "steps: 5}", "steps: 7}");
  EXPECT_EQ(tune(sweep_args("--resume")).err.rfind("error: --resume: base.train.steps changed "
                                                   "(5 -> 7) since sweep 'fake' started; ",
                                                   0),
            0u);

  // The profile's contents decide trials too (its limits, nodes, devices).
  std::ofstream(experiment_) << experiment;
  rewrite(profile, "memory_gib: 10", "memory_gib: 12");
  Result changed_profile = tune(sweep_args("--resume"));
  expect_one_error_line(changed_profile);
  EXPECT_EQ(changed_profile.err.rfind("error: --resume: hardware: the profile ", 0), 0u)
      << changed_profile.err;
  rewrite(profile, "memory_gib: 12", "memory_gib: 10");
  rewrite(profile, "description: 2-core", "description: a 2-core");  // decides nothing

  // The budget may change: it decides how many trials run, not what they measure.
  rewrite(experiment_, "budget: {trial_timeout_s: 30}",
          "budget: {trial_timeout_s: 30, max_trials: 3, wall_clock_s: 600}");
  Result resumed = tune(sweep_args("--resume"));
  ASSERT_EQ(resumed.status, 0) << resumed.out << resumed.err;
  EXPECT_EQ(ran(trials("fake")), 3);
  Result more = tune(sweep_args("--resume --max-trials 4"));
  ASSERT_EQ(more.status, 0) << more.out << more.err;
  EXPECT_EQ(ran(trials("fake")), 4);
}

// A sweep name becomes runs/<name> and goes into generated scripts: a line break or a path is
// refused in one line naming the field, before the database (or anything else) is written.
TEST_F(SweepGuardTest, UnsafeSweepNamesAreRefusedBeforeAnythingIsWritten) {
  const std::string experiment = read_text(experiment_);
  rewrite(experiment_, "name: fake", "name: \"fake\\ntouch pwned\"");
  Result newline = tune(sweep_args());
  expect_one_error_line(newline);
  EXPECT_NE(newline.err.find(": name: 'fake\\x0atouch pwned' is not a sweep name"),
            std::string::npos)
      << newline.err;

  std::ofstream(experiment_) << experiment;
  rewrite(experiment_, "name: fake", "name: ../up");
  Result up = tune(sweep_args());
  expect_one_error_line(up);
  EXPECT_NE(up.err.find(": name: '../up' is not a sweep name"), std::string::npos) << up.err;

  std::ofstream(experiment_) << experiment;
  for (const std::string name : {"../evil", "a\nb", ".."}) {
    SCOPED_TRACE(name);
    const Result r = tune(sweep_args("--name '" + name + "'"));
    expect_one_error_line(r);
    EXPECT_EQ(r.err.rfind("error: --name: '", 0), 0u) << r.err;
  }
  EXPECT_FALSE(fs::exists(db_));
  EXPECT_FALSE(fs::exists(dir_ / "runs"));
  EXPECT_FALSE(fs::exists(dir_ / "evil"));  // <db dir>/runs/../evil
  EXPECT_FALSE(fs::exists(dir_ / "up"));
}

// ---------------------------------------------------------------------------------------------
// The tie rule of the recommendation (recommend/ranking.h)

store::TrialRecord ok_trial(int64_t id, const std::string& point, double tokens_per_s, double ms) {
  store::TrialRecord t;
  t.id = id;
  t.point = point;
  t.status = "ok";
  t.seqlen = 4096;
  t.tokens_per_s_per_rank = tokens_per_s;
  t.step_ms = ms;
  t.summary = R"({"measured_steps": 2})";
  return t;
}

// A warm-up step (slow, not measured) and two measured steps of `a` and `b` ms.
std::vector<store::TrialStep> steps(double a, double b) {
  std::vector<store::TrialStep> out(3);
  out[0].step = 1, out[0].step_ms = 900.0;
  out[1].step = 2, out[1].step_ms = a;
  out[2].step = 3, out[2].step_ms = b;
  return out;
}

TEST(RecommendTies, ConfigurationsInsideTheSpreadOfTheirStepsAreTied) {
  // The winner: 1000 tokens/s per rank at 100 ms (steps 98 and 102 ms: 980-1020). The runner-up
  // 1.5% slower, with steps overlapping the winner's; the third 30% slower.
  const std::vector<store::TrialRecord> trials = {
      ok_trial(1, R"({"mesh.sp":"1"})", 1000.0, 100.0), ok_trial(2, R"({"mesh.sp":"2"})", 985.0, 101.5),
      ok_trial(3, R"({"mesh.sp":"4"})", 700.0, 142.9)};
  recommend::StepsByTrial by_trial = {
      {1, steps(98.0, 102.0)}, {2, steps(100.0, 103.0)}, {3, steps(142.0, 143.8)}};
  const std::optional<recommend::StepRange> range =
      recommend::measured_range(trials[0], by_trial[1]);
  ASSERT_TRUE(range);  // the 900 ms warm-up step is not measured
  EXPECT_NEAR(range->slowest, 1000.0 * 100.0 / 102.0, 1e-9);
  EXPECT_NEAR(range->fastest, 1000.0 * 100.0 / 98.0, 1e-9);
  EXPECT_TRUE(recommend::tied(trials[0], by_trial[1], trials[1], by_trial[2]));
  EXPECT_FALSE(recommend::tied(trials[0], by_trial[1], trials[2], by_trial[3]));
  EXPECT_FALSE(recommend::tied(trials[0], {}, trials[1], {}));  // no steps: no tie

  recommend::Objective o;
  o.kind = "throughput";
  o.target_length = 4096;
  o.check_peak = false;
  const std::vector<recommend::PointSummary> summaries =
      recommend::summarize_points(trials, o, trials[0], by_trial);
  ASSERT_EQ(summaries.size(), 3u);
  EXPECT_EQ(summaries[0].limited_by, "the winner");
  EXPECT_TRUE(summaries[1].tied_with_winner);
  EXPECT_EQ(summaries[1].limited_by.rfind("tied with the winner: 985 vs 1000 tokens/s per rank is "
                                          "inside the spread of their measured steps",
                                          0),
            0u)
      << summaries[1].limited_by;
  EXPECT_FALSE(summaries[2].tied_with_winner);
  EXPECT_EQ(summaries[2].limited_by.rfind("slower: 700 vs 1000", 0), 0u)
      << summaries[2].limited_by;
}

}  // namespace
}  // namespace ulysses::sweep
