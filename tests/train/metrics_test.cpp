// MetricsWriter's summary: medians over the measured steps, the warm-up left out, and after a
// resume the first steps of the new process left out too (they are cold again); the names of the
// category times; the size cap on the metrics.jsonl a resume reads.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "support/test_files.h"
#include "memory/memory_stats.h"
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

// The category times keep their names in metrics.jsonl and summary.json; comm_wait_ms is the
// comm the compute stream waited on (every collective blocks it, so it equals comm_ms).
TEST(Metrics, CommWaitIsNamedForWhatItMeasures) {
  TempDir dir;
  profile::StepTimes times;
  times.comm_ms = 7.0;
  times.comm_wait_ms = 7.0;
  StepMetrics m = step(1, 10.0);
  m.set_times(times);
  {
    MetricsWriter writer(dir.path().string(), 0);
    writer.write_step(m);
    writer.write_summary({});
  }
  std::ifstream lines(dir.path() / "metrics.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(lines, line));
  const nlohmann::json record = nlohmann::json::parse(line);
  EXPECT_EQ(record.at("comm_wait_ms").get<double>(), 7.0);
  EXPECT_FALSE(record.contains("exposed_comm_ms"));
  EXPECT_EQ(summary(dir).at("comm_wait_ms_median").get<double>(), 7.0);
  EXPECT_FALSE(summary(dir).contains("exposed_comm_ms_median"));
}

// The summary names the start-up baseline the peak counts from once the rank recorded it: the
// resident high-water mark on CPU, 0 on CUDA (the device footprint counts from zero).
TEST(Metrics, SummaryRecordsTheStartupBaseline) {
  TempDir dir;
  memory::record_startup_baseline(c10::Device(c10::kCPU));
  const std::optional<int64_t> baseline = memory::startup_baseline_bytes();
  ASSERT_TRUE(baseline.has_value());
  EXPECT_GT(*baseline, 0);
  {
    MetricsWriter writer(dir.path().string(), 0);
    writer.write_step(step(1, 10.0));
    writer.write_summary({});
  }
  EXPECT_EQ(summary(dir).at("memory_baseline_bytes").get<int64_t>(), *baseline);
  memory::record_startup_baseline(c10::Device(c10::kCUDA, 0));
  EXPECT_EQ(memory::startup_baseline_bytes(), 0);
}

// A metrics.jsonl to resume from that is over kMaxMetricsFileBytes is refused in one line before
// any of it is read.
TEST(Metrics, ResumeRefusesAMetricsFileOverTheCap) {
  TempDir dir;
  const std::filesystem::path path = dir.path() / "metrics.jsonl";
  std::ofstream(path) << "";
  std::filesystem::resize_file(path, kMaxMetricsFileBytes + (int64_t{1} << 20));  // sparse
  try {
    MetricsWriter writer(dir.path().string(), 1, /*resumed_step=*/3);
    ADD_FAILURE() << "an oversized metrics.jsonl was read";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              path.string() + ": 257.0 MiB is over the 256 MiB limit of a metrics file");
  }
}

}  // namespace
}  // namespace ulysses::train
