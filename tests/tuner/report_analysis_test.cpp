// The pure parts of tuner/report: the Pareto front, fastest and longest per mesh, time
// breakdown, axes and configurations, peaks above the start-up baseline, the ranking by the
// sweep's objective, and the table printers (terminal, markdown, CSV).
#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"
#include "tuner/results/format.h"
#include "tuner/results/machine_load.h"
#include "tuner/results/memory_basis.h"
#include "tuner/results/objective.h"
#include "tuner/report/plot_script.h"
#include "tuner/results/sweep_analysis.h"
#include "tuner/results/table.h"

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

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

// `t` as a trial of `device` that recorded `peak` (whole process on CPU, allocator on CUDA).
TrialRecord with_peak(TrialRecord t, const std::string& device, int64_t peak) {
  t.summary = R"({"device":")" + device + R"("})";
  t.peak_mem_bytes = peak;
  return t;
}

TEST(MemoryBasis, PeaksCountAboveTheStartUpBaselineOfTheirDevice) {
  const int64_t baseline = memory_baseline_bytes("cpu");
  EXPECT_GT(baseline, 64 * kMiB);  // LibTorch, Gloo and the OpenMP pool
  EXPECT_EQ(memory_baseline_bytes("cuda"), 0);

  // CPU: the stored peak is the whole resident set; the baseline comes off it.
  const TrialRecord cpu = with_peak(trial(1, 1, 2, 1024, "ok", 1), "cpu", 200 * kMiB);
  EXPECT_EQ(trial_device(cpu), "cpu");
  EXPECT_EQ(peak_above_baseline(cpu), 200 * kMiB - baseline);
  EXPECT_EQ(above_baseline(cpu, 300 * kMiB), 300 * kMiB - baseline);  // a prediction, same basis
  EXPECT_EQ(peak_above_baseline(with_peak(cpu, "cpu", baseline / 2)), 0);  // never below 0
  // CUDA: the device footprint counts whole (reserved peak + context and NCCL; baseline 0).
  const TrialRecord cuda = with_peak(trial(2, 1, 2, 1024, "ok", 1), "cuda:0", 5 * kGiB);
  EXPECT_EQ(trial_device(cuda), "cuda");
  EXPECT_EQ(peak_above_baseline(cuda), 5 * kGiB);
  // A trial without a summary (out of memory) is read from its run config.
  TrialRecord oom = trial(3, 1, 2, 4096, "oom", std::nullopt);
  oom.config_yaml = "train: {device: cuda}\n";
  oom.peak_mem_bytes = 7 * kGiB;
  EXPECT_EQ(trial_device(oom), "cuda");
  EXPECT_EQ(peak_above_baseline(oom), 7 * kGiB);
  oom.config_yaml = "not: [a run config";
  EXPECT_EQ(trial_device(oom), "cpu");  // unreadable: the default device
  EXPECT_EQ(peak_above_baseline(trial(4, 1, 2, 1024, "ok", 1)), std::nullopt);

  const std::string note = memory_basis_note({cpu, cuda});
  EXPECT_NE(note.find("For 1 trial from an older ulysses-train that did not record it, the cost "
                      "model's estimate (its runtime term), a baseline of " +
                      memory_size(baseline) + ", stands in."),
            std::string::npos)
      << note;
  EXPECT_NE(note.find("On CUDA the peak is the rank's device footprint"), std::string::npos)
      << note;
  EXPECT_EQ(memory_basis_note({cuda}).find("On CPU"), std::string::npos);
}

// A trial of the current ulysses-train records its measured start-up baseline in summary.json:
// that is what comes off its peak, and nothing is called estimated. A trial of an older build
// (no field) still reports, on the cost model's estimate, and says so.
TEST(MemoryBasis, TheRecordedBaselineIsSubtractedAndTheEstimateNamed) {
  TrialRecord measured = with_peak(trial(1, 1, 2, 1024, "ok", 1), "cpu", 200 * kMiB);
  measured.summary = R"({"device":"cpu","memory_baseline_bytes":)" +
                     std::to_string(150 * kMiB) + "}";
  EXPECT_EQ(recorded_baseline_bytes(measured), 150 * kMiB);
  EXPECT_FALSE(baseline_estimated(measured));
  EXPECT_EQ(peak_above_baseline(measured), 50 * kMiB);
  EXPECT_EQ(trial_basis(measured), "above the start-up baseline 150 MiB");
  const std::string note = memory_basis_note({measured});
  EXPECT_NE(note.find("as each trial measured and recorded it"), std::string::npos) << note;
  EXPECT_EQ(note.find("estimate"), std::string::npos) << note;
  EXPECT_EQ(memory_basis_caption({measured}),
            "peak above the start-up baseline (RSS minus the measured baseline)");

  const TrialRecord old = with_peak(trial(2, 1, 2, 1024, "ok", 1), "cpu", 200 * kMiB);
  EXPECT_EQ(recorded_baseline_bytes(old), std::nullopt);
  EXPECT_TRUE(baseline_estimated(old));
  EXPECT_EQ(trial_basis(old), "above the start-up baseline " +
                                  memory_size(memory_baseline_bytes("cpu")) + " (estimated)");
  EXPECT_NE(memory_basis_note({measured, old}).find("1 trial from an older ulysses-train that "
                                                    "did not record it"),
            std::string::npos);
  // CUDA counts from zero, recorded or not.
  TrialRecord cuda = with_peak(trial(3, 1, 2, 1024, "ok", 1), "cuda:0", 5 * kGiB);
  EXPECT_FALSE(baseline_estimated(cuda));
  EXPECT_EQ(trial_basis(cuda), "above the start-up baseline (CUDA: device footprint, baseline 0)");
}

// The report's header says how loaded the machine was: min, median and max of the 1-minute load
// over every trial's start and end, and the cores; a sweep that recorded none says so.
TEST(MachineLoad, MinMedianMaxOverTheTrialsAndTheCores) {
  std::vector<store::TrialLoad> loads(3);
  loads[0] = {1, 0.5, 1.0, 2};
  loads[1] = {2, 3.0, std::nullopt, 2};  // its end was not readable
  loads[2] = {3, 1.5, 2.0, 0};
  EXPECT_EQ(machine_load_text(loads),
            "1-minute load average 0.50 min, 1.50 median, 3.00 max over the start and end of 3 "
            "trials; 2 cores");
  EXPECT_EQ(machine_load_text({}),
            "not recorded (the sweep was run by a ulysses-tune that did not record it)");
  EXPECT_EQ(machine_load_text({{4, std::nullopt, std::nullopt, 2}}), machine_load_text({}));
}

// Memory for people: MiB under 1 GiB (so 0.04 and 0.045 GiB read apart), GiB above.
TEST(Format, MemorySizeKeepsSmallPeaksApart) {
  EXPECT_EQ(memory_size(std::nullopt), "");
  EXPECT_EQ(memory_size(46 * kMiB), "46 MiB");
  EXPECT_EQ(memory_size(static_cast<int64_t>(0.04 * kGiB)), "41 MiB");
  EXPECT_EQ(memory_size(static_cast<int64_t>(0.045 * kGiB)), "46 MiB");
  EXPECT_EQ(memory_size(kMiB * 9 / 2), "4.5 MiB");
  EXPECT_EQ(memory_size(0), "0.0 MiB");
  EXPECT_EQ(memory_size(kGiB + kGiB / 4), "1.25 GiB");
  EXPECT_EQ(memory_size(kGiB - 1), "1.00 GiB");  // 1024 MiB once rounded
  EXPECT_EQ(memory_size(9 * kGiB - 123 * kMiB), "8.88 GiB");
}

TEST(Objective, RanksTrialsByTheObjective) {
  const std::vector<TrialRecord> trials = {
      trial(1, 1, 2, 1024, "ok", 900),   trial(2, 2, 1, 1024, "ok", 1100),
      trial(3, 1, 2, 4096, "ok", 700),   trial(4, 2, 1, 4096, "ok", 700),
      trial(5, 1, 2, 8192, "ok", 9000, /*probe=*/true), trial(6, 1, 2, 8192, "oom", std::nullopt),
      trial(7, 2, 1, 2048, "timeout", std::nullopt)};
  auto ids = [&](const Objective& o) {
    std::vector<int64_t> out;
    for (const TrialRecord* t : rank_trials(trials, o)) out.push_back(t->id);
    return out;
  };
  Objective longest;
  longest.kind = "max-seqlen";
  // Longest first (probe and OOM never count), equal length and speed: lower id first.
  EXPECT_EQ(ids(longest), (std::vector<int64_t>{3, 4, 2, 1}));
  EXPECT_EQ(describe(longest), "max-seqlen");
  Objective fastest;
  fastest.kind = "throughput";
  fastest.target_length = 1024;
  EXPECT_EQ(ids(fastest), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(describe(fastest), "throughput at 1024 tokens");
}

TEST(Objective, TheHeadRoomComparesThePeakAboveTheBaseline) {
  Objective o;
  o.kind = "max-seqlen";
  o.headroom = 0.1;
  o.check_peak = true;
  TrialRecord t = trial(1, 1, 2, 1024, "ok", 1);
  t.limit_bytes = 8 * kGiB;  // qualifies up to 7.2 GiB above the baseline
  // 7.25 GiB of resident set is 7.13 GiB above the CPU baseline: within the head-room.
  EXPECT_TRUE(qualifies(with_peak(t, "cpu", 7 * kGiB + kGiB / 4), o));
  // The CUDA allocator's 7.25 GiB are all above the baseline: over the head-room.
  EXPECT_FALSE(qualifies(with_peak(t, "cuda:0", 7 * kGiB + kGiB / 4), o));
  EXPECT_TRUE(qualifies(with_peak(t, "cuda:0", 7 * kGiB), o));
  o.check_peak = false;
  EXPECT_TRUE(qualifies(with_peak(t, "cuda:0", 8 * kGiB), o));
}

TEST(Objective, ReadFromTheSweepsExperiment) {
  store::SweepRecord sweep;
  sweep.name = "s";
  sweep.experiment_path = "experiments/s.yaml";
  sweep.experiment_yaml =
      "name: s\nhardware: cpu-local\nworld_size: 2\nheadroom: 0.2\n"
      "space:\n  mesh.sp: auto\n  sequence.length: [1024, 2048, 4096]\n"
      "objective: throughput\ntarget_length: 2048\n";
  Objective o = sweep_objective(sweep);
  EXPECT_EQ(o.kind, "throughput");
  EXPECT_EQ(o.target_length, 2048);
  EXPECT_DOUBLE_EQ(o.headroom, 0.2);
  EXPECT_FALSE(o.check_peak);  // CPU: the trials ran under the reduced limit
  sweep.experiment_yaml += "base: {train: {device: cuda}}\n";
  EXPECT_TRUE(sweep_objective(sweep).check_peak);
  sweep.experiment_yaml = "name: s\nhardware: no-such-profile\n";
  try {
    sweep_objective(sweep);
    ADD_FAILURE() << "no error";
  } catch (const UserError& error) {
    EXPECT_EQ(std::string(error.what()).rfind("sweep s: ", 0), 0u) << error.what();
  }
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
