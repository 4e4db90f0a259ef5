// The pure parts of tuner/report: the Pareto front, best per mesh, time breakdown, axes and
// configurations, and the table printers (terminal, markdown, CSV).
#include <gtest/gtest.h>

#include <cmath>

#include "tuner/report/plot_script.h"
#include "tuner/report/sweep_analysis.h"
#include "tuner/report/table.h"

namespace ulysses::report {
namespace {

std::vector<int64_t> front_ids(const std::vector<LengthThroughput>& points) {
  std::vector<int64_t> ids;
  for (const auto& p : pareto_front(points)) ids.push_back(p.trial_id);
  return ids;
}

TEST(ParetoFront, KeepsOnlyPointsNoOtherBeatsInLengthAndThroughput) {
  // (seqlen, tokens/s per rank, id)
  const std::vector<LengthThroughput> points = {
      {1024, 1000, 1},  // beaten by 4 (same length, faster)
      {2048, 900, 2},   // on the front
      {4096, 700, 3},   // on the front
      {1024, 1100, 4},  // on the front: the fastest
      {2048, 800, 5},   // beaten by 2
      {4096, 700, 6},   // equal to 3: only the lower id stays
      {8192, 100, 7},   // on the front: the longest
      {512, 1100, 8},   // beaten by 4 (longer, as fast)
      {3000, 650, 9},   // beaten by 3 (longer and faster)
  };
  EXPECT_EQ(front_ids(points), (std::vector<int64_t>{4, 2, 3, 7}));
  const auto front = pareto_front(points);
  for (size_t i = 1; i < front.size(); ++i) {
    EXPECT_GT(front[i].seqlen, front[i - 1].seqlen);
    EXPECT_LT(front[i].tokens_per_s_per_rank, front[i - 1].tokens_per_s_per_rank);
  }
}

TEST(ParetoFront, EdgeCases) {
  EXPECT_TRUE(pareto_front({}).empty());
  EXPECT_EQ(front_ids({{100, 5, 9}}), (std::vector<int64_t>{9}));
  EXPECT_EQ(front_ids({{100, 5, 9}, {100, 5, 3}}), (std::vector<int64_t>{3}));
  // Longer and faster beats everything; NaN throughput is ignored.
  EXPECT_EQ(front_ids({{100, 5, 1}, {200, 6, 2}, {300, std::nan(""), 3}}),
            (std::vector<int64_t>{2}));
  // A strictly decreasing staircase is entirely on the front.
  EXPECT_EQ(front_ids({{300, 1, 3}, {100, 3, 1}, {200, 2, 2}}), (std::vector<int64_t>{1, 2, 3}));
}

TrialRecord trial(int64_t id, int64_t dp, int64_t sp, int64_t seqlen, const std::string& status,
                  std::optional<double> tokens, bool probe = false) {
  TrialRecord t;
  t.id = id;
  t.dp = dp;
  t.sp = sp;
  t.world_size = dp * sp;
  t.seqlen = seqlen;
  t.status = status;
  t.probe = probe;
  t.tokens_per_s_per_rank = tokens;
  t.point = R"({"mesh.sp":)" + std::to_string(sp) +
            R"(,"memory.offload":"none","memory.tiled_mlp":4,"sequence.length":1})";
  return t;
}

TEST(SweepAnalysis, MeasuredTrialsBestPerMeshAndStatusCounts) {
  const std::vector<TrialRecord> trials = {
      trial(1, 1, 2, 1024, "ok", 500),          trial(2, 1, 2, 2048, "ok", 600),
      trial(3, 1, 2, 4096, "ok", 300),          trial(4, 1, 2, 8192, "ok", 9000, /*probe=*/true),
      trial(5, 2, 1, 1024, "oom", 700),         trial(6, 1, 2, 4096, "ok", 400),
      trial(7, 1, 2, 1024, "ok", std::nullopt), trial(8, 1, 1, 1, "weird", std::nullopt)};
  EXPECT_TRUE(is_measured(trials[0]));
  EXPECT_FALSE(is_measured(trials[3]));  // probe
  EXPECT_FALSE(is_measured(trials[4]));  // oom
  EXPECT_FALSE(is_measured(trials[6]));  // no throughput
  const auto best = best_per_mesh(trials);
  ASSERT_EQ(best.size(), 3u);  // sp 1 (1x1, 2x1) before sp 2
  EXPECT_EQ(best[0].dp, 1);
  EXPECT_EQ(best[0].sp, 1);
  EXPECT_EQ(best[1].dp, 2);
  EXPECT_FALSE(best[1].fastest.has_value());
  EXPECT_EQ(best[1].trials, 1);
  EXPECT_EQ(best[2].trials, 6);
  EXPECT_EQ(best[2].measured, 4);
  EXPECT_EQ(best[2].fastest->id, 2);
  EXPECT_EQ(best[2].longest->id, 6);  // 4096 at 400 beats 4096 at 300
  const auto counts = status_counts(trials);
  ASSERT_EQ(counts.size(), 3u);
  EXPECT_EQ(counts[0], (std::pair<std::string, int>{"ok", 6}));
  EXPECT_EQ(counts[1], (std::pair<std::string, int>{"oom", 1}));
  EXPECT_EQ(counts[2], (std::pair<std::string, int>{"weird", 1}));
}

TEST(SweepAnalysis, AxesAndConfigurations) {
  TrialRecord t = trial(1, 1, 2, 1024, "ok", 1);
  EXPECT_EQ(axis_values(t), (std::vector<std::pair<std::string, std::string>>{
                                {"memory.offload", "none"}, {"memory.tiled_mlp", "4"}}));
  EXPECT_EQ(configuration(t), "dp=1 sp=2 offload=none tiled_mlp=4");
  EXPECT_EQ(axis_value(t, "memory.tiled_mlp"), "4");
  EXPECT_EQ(axis_value(t, "memory.nope"), "");
  EXPECT_EQ(axis_headers({"memory.tiled_mlp", "a.offload", "b.offload"}),
            (std::vector<std::string>{"tiled_mlp", "a.offload", "b.offload"}));
  TrialRecord other = t;
  other.point = R"({"memory.checkpointing":true,"memory.tiled_mlp":2})";
  EXPECT_EQ(axis_keys({t, other}), (std::vector<std::string>{"memory.offload", "memory.tiled_mlp",
                                                             "memory.checkpointing"}));
  other.point = "not json";
  EXPECT_EQ(axis_values(other),
            (std::vector<std::pair<std::string, std::string>>{{"point", "not json"}}));
}

TEST(SweepAnalysis, TimeBreakdownOtherIsTheRestOfTheStep) {
  TrialRecord t = trial(1, 1, 2, 1024, "ok", 1);
  t.step_ms = 100.0;
  const auto b = time_breakdown(
      t,
      {{"compute_ms", 50}, {"comm_ms", 20}, {"a2a", 20}, {"offload_ms", 5}, {"optimizer_ms", 4}});
  EXPECT_DOUBLE_EQ(b.compute_ms, 50);
  EXPECT_DOUBLE_EQ(b.comm_ms, 20);
  EXPECT_DOUBLE_EQ(b.offload_ms, 5);
  EXPECT_DOUBLE_EQ(b.optimizer_ms, 4);
  EXPECT_DOUBLE_EQ(b.other_ms, 21);
  EXPECT_DOUBLE_EQ(time_breakdown(t, {}).other_ms, 100);
  EXPECT_DOUBLE_EQ(time_breakdown(t, {{"compute_ms", 90}, {"comm_ms", 30}}).other_ms, 0);
}

TEST(Table, PrintersQuoteAndAlign) {
  Table table;
  table.add_column("name");
  table.add_column("ms", /*right=*/true);
  table.rows = {{"a|b", "1.5"}, {"line\nbreak, \"q\"", "100.25"}, {"", ""}};
  EXPECT_EQ(render_markdown(table),
            "| name | ms |\n|---|---:|\n| a\\|b | 1.5 |\n| line break, \"q\" | 100.25 |\n"
            "|   |   |\n");
  EXPECT_EQ(render_csv(table), "name,ms\r\na|b,1.5\r\n\"line\nbreak, \"\"q\"\"\",100.25\r\n,\r\n");
  EXPECT_EQ(render_terminal(table),
            "name                 ms\n"
            "---------------  ------\n"
            "a|b                 1.5\n"
            "line break, \"q\"  100.25\n"
            "\n");
  EXPECT_EQ(render_terminal(table, 8).substr(0, 17), "name          ms\n");
  EXPECT_NE(render_terminal(table, 8).find("line ...  100.25"), std::string::npos)
      << render_terminal(table, 8);
  EXPECT_EQ(csv_field("plain"), "plain");
  EXPECT_EQ(csv_field("a\rb"), "\"a\rb\"");
  EXPECT_EQ(gnuplot_quote("it's\nx"), "'it''s x'");
}

}  // namespace
}  // namespace ulysses::report
