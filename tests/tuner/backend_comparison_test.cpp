// Ours against DeepSpeed in one sweep (tuner/results/backend_comparison.h): trials of the two
// backends paired by configuration and length, the ratios, the report's side-by-side table,
// section and plot, and a sweep of one backend that shows none of it.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tuner/report/plot_script.h"
#include "tuner/report/report_writer.h"
#include "tuner/report/summary_tables.h"
#include "tuner/results/backend_comparison.h"
#include "tuner/results/memory_basis.h"
#include "tuner/results/sweep_analysis.h"

namespace ulysses::report {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

store::TrialRecord trial(int64_t id, const std::string& backend, int64_t tiles, int64_t seqlen,
                         const std::string& status, double tokens_per_s, int64_t peak_mib,
                         double first, double final, const std::string& extra = "") {
  store::TrialRecord t;
  t.id = id;
  t.dp = 1, t.sp = 2, t.world_size = 2;
  t.seqlen = seqlen;
  t.status = status;
  t.point = "{\"backend\":\"" + backend + "\",\"mesh.sp\":2,\"memory.tiled_mlp\":" +
            std::to_string(tiles) + ",\"sequence.length\":" + std::to_string(seqlen) + "}";
  t.config_yaml = "train: {device: cpu}\n";
  if (status == "ok") {
    t.tokens_per_s_per_rank = tokens_per_s;
    t.step_ms = 100;
    t.peak_mem_bytes = peak_mib * kMiB;
    t.final_loss = final;
  }
  t.summary = "{\"device\":\"cpu\",\"first_loss\":" + nlohmann::json(first).dump() + extra + "}";
  return t;
}

std::vector<store::TrialRecord> both_backends() {
  // The deepspeed trials record their own baseline: 500 MiB of Python, torch and DeepSpeed.
  const std::string ds = ",\"memory_baseline_bytes\":" + std::to_string(500 * kMiB) +
                         ",\"workarounds\":[\"loss: gradients divided by sp\"]";
  return {trial(1, "native", 1, 1024, "ok", 1000, 400, 6.25, 6.0),
          trial(2, "deepspeed", 1, 1024, "ok", 800, 1100, 6.2500001, 6.0000002, ds),
          trial(3, "native", 2, 2048, "ok", 900, 700, 6.3, 6.1),
          trial(4, "deepspeed", 2, 2048, "oom", 0, 0, 6.3, 0, ds),
          trial(5, "native", 2, 4096, "ok", 700, 900, 6.4, 6.2)};
}

TEST(BackendComparison, PairsEachConfigurationAndLengthAcrossBackends) {
  const std::vector<store::TrialRecord> trials = both_backends();
  EXPECT_EQ(trial_backend(trials[0]), "native");
  EXPECT_EQ(trial_backend(trials[1]), "deepspeed");
  EXPECT_EQ(configuration(trials[1], "backend"), configuration(trials[0], "backend"));
  EXPECT_NE(configuration(trials[1]), configuration(trials[0]));  // plots keep them apart

  const std::vector<BackendPair> pairs = backend_pairs(trials);
  ASSERT_EQ(pairs.size(), 3u);
  EXPECT_EQ(pairs[0].native->id, 1);
  EXPECT_EQ(pairs[0].deepspeed->id, 2);
  ASSERT_TRUE(pairs[0].throughput_ratio);
  EXPECT_DOUBLE_EQ(*pairs[0].throughput_ratio, 0.8);
  // Each above its own baseline: ours 400 MiB - the CPU estimate, theirs 1100 - 500 MiB.
  ASSERT_TRUE(pairs[0].peak_ratio);
  EXPECT_DOUBLE_EQ(*pairs[0].peak_ratio,
                   static_cast<double>(600 * kMiB) /
                       static_cast<double>(*peak_above_baseline(trials[0])));
  EXPECT_EQ(trial_baseline_bytes(trials[1]), 500 * kMiB);
  EXPECT_NEAR(*pairs[0].first_loss_difference, 1e-7, 1e-9);
  EXPECT_NEAR(*pairs[0].final_loss_difference, 2e-7, 1e-9);
  // DeepSpeed ran out of memory where ours fit: paired, with no ratios.
  EXPECT_EQ(pairs[1].deepspeed->status, "oom");
  EXPECT_FALSE(pairs[1].throughput_ratio);
  EXPECT_FALSE(pairs[1].peak_ratio);
  // A length only ours ran.
  EXPECT_EQ(pairs[2].deepspeed, nullptr);
  EXPECT_EQ(workarounds(trials[1]), (std::vector<std::string>{"loss: gradients divided by sp"}));
  EXPECT_TRUE(workarounds(trials[0]).empty());
}

TEST(BackendComparison, TheReportShowsBothSideBySideWithThePlot) {
  SweepData data;
  data.sweep.name = "both";
  data.trials = both_backends();
  const Table table = backends_table(data);
  ASSERT_EQ(table.rows.size(), 3u);
  EXPECT_EQ(table.rows[0][0], "1");  // the plot's label
  EXPECT_EQ(table.rows[0][3], "#1 ok");
  EXPECT_EQ(table.rows[0][4], "#2 ok");
  EXPECT_EQ(table.rows[0][7], "0.80");
  EXPECT_EQ(table.rows[1][4], "#4 oom");
  EXPECT_EQ(table.rows[1][7], "-");
  EXPECT_EQ(table.rows[2][4], "-");

  const PlotFiles files = make_plot_files(data);
  const auto plot = std::find_if(files.plots.begin(), files.plots.end(),
                                 [](const Plot& p) { return p.file == "backends.png"; });
  ASSERT_NE(plot, files.plots.end());
  EXPECT_TRUE(plot->omitted.empty());
  const auto dat = std::find_if(files.files.begin(), files.files.end(),
                                [](const auto& f) { return f.first == "backends.dat"; });
  ASSERT_NE(dat, files.files.end());
  EXPECT_NE(dat->second.find("\n1 1000 800\n"), std::string::npos) << dat->second;
  EXPECT_NE(dat->second.find("\n2 900 NaN\n"), std::string::npos) << dat->second;

  const std::string readme = render_readme(data, files.plots, "ulysses-tune report");
  EXPECT_NE(readme.find("## Ours vs DeepSpeed"), std::string::npos);
  EXPECT_NE(readme.find("- loss: gradients divided by sp"), std::string::npos);
  EXPECT_NE(readme.find("](backends.png)"), std::string::npos);
  EXPECT_NE(readme.find("own baseline"), std::string::npos);
}

TEST(BackendComparison, ASweepOfOneBackendHasNoComparison) {
  SweepData data;
  data.sweep.name = "ours";
  for (const store::TrialRecord& t : both_backends()) {
    if (trial_backend(t) == "native") data.trials.push_back(t);
  }
  EXPECT_TRUE(backend_pairs(data.trials).empty());
  EXPECT_TRUE(backends_table(data).rows.empty());
  const PlotFiles files = make_plot_files(data);
  for (const Plot& p : files.plots) EXPECT_NE(p.file, "backends.png");
  EXPECT_EQ(render_readme(data, files.plots, "x").find("Ours vs DeepSpeed"), std::string::npos);
}

}  // namespace
}  // namespace ulysses::report
