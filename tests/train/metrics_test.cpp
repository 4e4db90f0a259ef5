// MetricsWriter's summary: medians over the measured steps, the warm-up left out, and after a
// resume the first steps of the new process left out too (they are cold again).
#include <gtest/gtest.h>

#include <fstream>

#include "support/test_files.h"
#include "train/metrics.h"

namespace ulysses::train {
namespace {

using testing::TempDir;

StepMetrics step(int64_t n, double ms) {
  StepMetrics m;
  m.step = n;
  m.step_ms = ms;
  m.tokens = 100;
  m.tokens_per_s = 100.0 / (ms / 1000.0);
  return m;
}

nlohmann::json summary(const TempDir& dir) {
  std::ifstream in(dir.path() / "summary.json");
  return nlohmann::json::parse(in);
}

TEST(Metrics, WarmupStepsOfEveryProcessAreLeftOut) {
  TempDir dir;
  {  // steps 1-3, warm-up 1: step 1 (100 ms) is cold
    MetricsWriter writer(dir.path().string(), 1);
    for (auto [n, ms] : {std::pair{1, 100.0}, {2, 10.0}, {3, 20.0}}) writer.write_step(step(n, ms));
    writer.write_summary({});
  }
  EXPECT_DOUBLE_EQ(summary(dir)["step_ms_median"].get<double>(), 15.0);
  {  // resumed after step 3: step 4 (1000 ms) is this process's warm-up
    MetricsWriter writer(dir.path().string(), 1, /*resumed_step=*/3);
    EXPECT_EQ(writer.kept_steps(), 3);
    for (auto [n, ms] : {std::pair{4, 1000.0}, {5, 30.0}}) writer.write_step(step(n, ms));
    writer.write_summary({});
  }
  EXPECT_DOUBLE_EQ(summary(dir)["step_ms_median"].get<double>(), 20.0);  // of 10, 20, 30
}

}  // namespace
}  // namespace ulysses::train
