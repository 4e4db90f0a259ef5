// What every printer of a trial says (one result schema, many printers): the mesh with its split
// (`list`, the report's tables and plot labels, WHY.md); peak memory against the limit on the
// quantity the limit caps (on CPU address space, not RSS) with RSS called RSS; one unit for the
// memory plot's points and limit; step-time predictions flagged when the cost model was not
// calibrated. The trials carry the numbers of a real 4-rank CPU sweep (reports/ring-vs-a2a-cpu):
// a ring trial whose RSS above its start-up RSS (496 MiB) passed the 415 MiB limit while its
// address space, which the limit caps, stayed under it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "common/remove_tree.h"
#include "tuner/recommend/ranking.h"
#include "tuner/recommend/why.h"
#include "tuner/report/list_show_command.h"
#include "tuner/report/plot_script.h"
#include "tuner/report/report_writer.h"
#include "tuner/report/trial_table.h"
#include "tuner/results/format.h"
#include "tuner/results/memory_basis.h"
#include "tuner/results/sweep_analysis.h"
#include "tuner/results/sweep_source.h"
#include "tuner/store/store.h"
#include "tuner/store/sweep_store.h"

namespace ulysses::report {
namespace {

using store::TrialRecord;

constexpr int64_t kMiB = int64_t{1} << 20;

// A small Llama with 4 query / 2 KV heads (reports/ring-vs-a2a-cpu), on CPU.
std::string run_config(int64_t sp, const std::string& mesh_extra, int64_t length) {
  return "model: {hidden_size: 128, intermediate_size: 256, num_layers: 4, num_heads: 4, "
         "num_kv_heads: 2, vocab_size: 512}\nmesh: {dp: 1, sp: " +
         std::to_string(sp) + mesh_extra + "}\nsequence: {length: " + std::to_string(length) +
         "}\n";
}

// An ok CPU trial: RSS `rss_above` above a recorded start-up RSS of 150 MiB, address space
// `address_space` (nullopt: an older ulysses-train that recorded none) above its start-up size.
TrialRecord cpu_trial(int64_t id, int64_t sp, const std::string& mesh_extra, int64_t length,
                      int64_t rss_above, std::optional<int64_t> address_space) {
  TrialRecord t;
  t.id = id;
  t.sweep_id = 1;
  t.key = "t" + std::to_string(id);
  t.point = R"({"sequence.length":)" + std::to_string(length) + "}";
  t.config_yaml = run_config(sp, mesh_extra, length);
  t.seqlen = length;
  t.world_size = sp;
  t.sp = sp;
  t.status = "ok";
  t.exit_code = 0;
  t.step_ms = 4000.0;
  t.tokens_per_s_per_rank = 385.0;
  t.tokens_per_s = 385.0 * static_cast<double>(sp);
  t.limit_bytes = 415 * kMiB;
  t.peak_mem_bytes = 150 * kMiB + rss_above;
  t.predicted_peak_bytes = 150 * kMiB + rss_above;
  t.predicted_step_ms = 400.0;  // the uncalibrated model on a CPU: far too short
  t.summary = R"({"device": "cpu", "memory_baseline_bytes": )" + std::to_string(150 * kMiB) +
              (address_space ? R"(, "max_rank_peak_address_space_bytes": )" +
                                   std::to_string(*address_space)
                             : std::string()) +
              "}";
  return t;
}

// The ring trial (sp 4 = 1 all-to-all x 4 ring), an uneven one (sp 3 over 4 heads), an
// all-to-all one; an out-of-memory trial (no summary.json) and a pruned one (a prediction only).
std::vector<TrialRecord> cpu_sweep() {
  std::vector<TrialRecord> trials = {
      cpu_trial(1, 4, ", sp_ring: 4", 18432, 496 * kMiB, 400 * kMiB),
      cpu_trial(2, 3, ", uneven_heads: true", 12288, 300 * kMiB, 380 * kMiB),
      cpu_trial(3, 4, ", sp_ring: 2", 8192, 200 * kMiB, 250 * kMiB),
      cpu_trial(4, 4, "", 16384, 415 * kMiB, 410 * kMiB)};
  TrialRecord oom = cpu_trial(5, 4, "", 17408, 420 * kMiB, std::nullopt);
  oom.status = "oom", oom.exit_code = 12, oom.summary = "{}";
  oom.step_ms.reset(), oom.tokens_per_s.reset(), oom.tokens_per_s_per_rank.reset();
  TrialRecord pruned = cpu_trial(6, 4, "", 32768, 900 * kMiB, std::nullopt);
  pruned.status = "pruned", pruned.exit_code.reset(), pruned.summary = "{}";
  pruned.peak_mem_bytes.reset(), pruned.step_ms.reset(), pruned.tokens_per_s.reset();
  pruned.tokens_per_s_per_rank.reset();
  trials.push_back(oom);
  trials.push_back(pruned);
  return trials;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Printers, TheMeshSaysItsSplit) {
  const std::vector<TrialRecord> trials = cpu_sweep();
  EXPECT_EQ(mesh(trials[0]), "1x4 (1 a2a x 4 ring)");
  EXPECT_EQ(mesh(trials[1]), "1x3 uneven");
  EXPECT_EQ(mesh(trials[2]), "1x4 (2 a2a x 2 ring)");
  EXPECT_EQ(mesh(trials[3]), "1x4");
  EXPECT_EQ(mesh_text(1, 6, 2, true), "1x6 (3 a2a x 2 ring) uneven");  // plan's rows
  EXPECT_EQ(configuration(trials[2]), "dp=1 sp=4 (2 a2a x 2 ring)");
  TrialRecord invalid = trials[3];
  invalid.config_yaml = "mesh: {sp: 3}\n";  // 8 heads by default: a config that does not validate
  invalid.sp = 3;
  EXPECT_EQ(mesh(invalid), "1x3");

  // Tables: every trial's row and the per-mesh table, one row per split.
  const std::string list = render_terminal(trials_table(trials));
  for (const char* m : {"1x4 (1 a2a x 4 ring)", "1x3 uneven", "1x4 (2 a2a x 2 ring)"}) {
    EXPECT_TRUE(contains(list, m)) << m << "\n" << list;
  }
  const Table per_mesh = best_per_mesh_table(trials);
  std::vector<std::string> meshes;
  for (const auto& row : per_mesh.rows) meshes.push_back(row[0]);
  EXPECT_EQ(meshes, (std::vector<std::string>{"1x3 uneven", "1x4", "1x4 (1 a2a x 4 ring)",
                                              "1x4 (2 a2a x 2 ring)"}));
  // The plots' labels.
  SweepData data;
  data.sweep.name = "cpu";
  data.trials = trials;
  for (const auto& [name, content] : make_plot_files(data).files) {
    if (name == "phases.dat" || name == "prediction.dat") {
      EXPECT_TRUE(contains(content, "1: 1x4 (1 a2a x 4 ring) sl=18432")) << content;
      EXPECT_TRUE(contains(content, "2: 1x3 uneven sl=12288")) << content;
    }
    if (name == "throughput.dat") {
      EXPECT_TRUE(contains(content, "# dp=1 sp=3 uneven")) << content;
    }
  }
}

// `list --sweep` prints the split of a stored ring and uneven trial.
TEST(Printers, ListSaysTheSplit) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("printers-test-" + std::to_string(getpid()));
  ulysses::remove_tree(dir);
  std::filesystem::create_directories(dir);
  const std::string db = (dir / "results.db").string();
  {
    store::Store s = store::Store::open(db);
    store::SweepStore sweeps(s.db());
    store::SweepRecord sweep;
    sweep.name = "cpu";
    const int64_t id = sweeps.create_sweep(sweep);
    for (TrialRecord t : cpu_sweep()) {
      t.sweep_id = id;
      sweeps.add_trial(t);
    }
  }
  ListOptions o;
  o.db_path = db;
  o.sweep = "cpu";
  std::ostringstream out;
  ASSERT_EQ(run_list(o, out), 0);
  EXPECT_TRUE(contains(out.str(), "1x4 (1 a2a x 4 ring)")) << out.str();
  EXPECT_TRUE(contains(out.str(), "1x3 uneven")) << out.str();
  ulysses::remove_tree(dir);
}

// No ok trial is shown above its limit in the quantity compared with it; RSS is called RSS.
TEST(Printers, OkCpuTrialsAreComparedOnTheAddressSpaceTheLimitCaps) {
  const std::vector<TrialRecord> trials = cpu_sweep();
  const TrialRecord& ring = trials[0];
  EXPECT_EQ(peak_above_baseline(ring), 496 * kMiB);  // RSS: above the limit
  EXPECT_EQ(capped_peak(ring), 400 * kMiB);          // what the limit caps: within it
  EXPECT_EQ(peak_against_limit(ring),
            "address space 400 MiB (above its start-up size) of a per-rank limit of 415 MiB (RSS "
            "496 MiB above its start-up RSS)");
  // A trial of an older ulysses-train: the limit is compared with nothing.
  const TrialRecord old = cpu_trial(7, 4, "", 4096, 66 * kMiB, std::nullopt);
  EXPECT_EQ(peak_against_limit(old),
            "RSS 66 MiB above its start-up RSS; the per-rank limit of 415 MiB caps address "
            "space, which it did not record");

  // The trials table: the limit beside the address space, every ok row within it.
  const Table table = trials_table(trials);
  const auto column = [&](const std::string& name) {
    const auto it = std::find(table.header.begin(), table.header.end(), name);
    EXPECT_NE(it, table.header.end()) << name;
    return static_cast<size_t>(it - table.header.begin());
  };
  const size_t rss = column("RSS above baseline"), capped = column("address space above baseline"),
               limit = column("limit");
  EXPECT_EQ(capped + 1, limit);
  for (size_t i = 0; i < trials.size(); ++i) {
    if (trials[i].status != "ok") continue;
    EXPECT_EQ(table.rows[i][capped], memory_size(capped_peak(trials[i])));
    EXPECT_LE(*capped_peak(trials[i]), *trials[i].limit_bytes) << trials[i].id;
  }
  EXPECT_EQ(table.rows[0][rss], "496 MiB");

  // WHY.md: the winner against its limit on that basis, the candidates with both columns.
  const recommend::Objective o{"max-seqlen", 0, 0.1, false};
  const std::vector<recommend::PointSummary> summaries =
      recommend::summarize_points(trials, o, ring);
  store::SweepRecord sweep;
  sweep.name = "cpu";
  const std::string why = recommend::render_why(
      sweep, o, ring, summaries, std::vector<std::vector<store::TrialPhase>>(summaries.size()));
  EXPECT_TRUE(contains(why, "dp=1 sp=4 (1 a2a x 4 ring), 18432 tokens, 385 tokens/s per rank, "
                            "address space 400 MiB (above its start-up size) of a per-rank "
                            "limit of 415 MiB (RSS 496 MiB above its start-up RSS)."))
      << why;
  EXPECT_FALSE(contains(why, "peak 496 MiB of a per-rank limit")) << why;
  EXPECT_TRUE(contains(why, "| RSS above baseline | address space above baseline |")) << why;
  EXPECT_TRUE(contains(why, "| dp=1 sp=3 uneven | #2 |")) << why;
  EXPECT_TRUE(contains(why, "memory.limit_gib does not cap that RSS")) << why;
}

// The memory note names why each trial without a recorded baseline has none.
TEST(Printers, TheMemoryNoteSaysWhyABaselineIsEstimated) {
  std::vector<TrialRecord> trials = cpu_sweep();
  trials.push_back(cpu_trial(7, 4, "", 4096, 66 * kMiB, std::nullopt));
  trials.back().summary = R"({"device": "cpu"})";  // an older ulysses-train
  const std::string note = memory_basis_note(trials);
  EXPECT_TRUE(contains(note, "1 trial from an older ulysses-train that did not record it, 1 "
                             "trial that stopped before writing summary.json (out of memory, "
                             "failed, killed or timed out) and the predicted peaks of 1 trial "
                             "that did not run (pruned or skipped)"))
      << note;
  EXPECT_FALSE(contains(note, "from a ulysses-train that did not record")) << note;
  EXPECT_TRUE(contains(note, "1 trial that ran to the end recorded no address space")) << note;
}

std::string file(const PlotFiles& files, const std::string& name) {
  for (const auto& [n, content] : files.files) {
    if (n == name) return content;
  }
  return "";
}

// memory.dat: points and the limit in one unit, chosen from the data; an ok trial never above
// the limit line. When an ok trial recorded no address space, its RSS is drawn and no limit.
TEST(Printers, TheMemoryPlotDrawsPointsAndLimitInOneUnit) {
  SweepData data;
  data.sweep.name = "cpu";
  data.trials = cpu_sweep();
  PlotFiles files = make_plot_files(data);
  std::string dat = file(files, "memory.dat");
  EXPECT_EQ(dat.rfind("# seqlen MiB trial_id: per rank, address space above the start-up "
                      "address space", 0),
            0u)
      << dat;
  EXPECT_TRUE(contains(dat, "\n18432 400 1\n")) << dat;    // the ring trial, in MiB
  EXPECT_TRUE(contains(dat, "\n17408 415 5\n")) << dat;    // out of memory: on its limit
  EXPECT_TRUE(contains(dat, "\n# per-rank limit 415 MiB (the dashed lines)\n")) << dat;
  // Every point is at most the limit's 415, which the script draws in the same unit.
  std::istringstream lines(dat);
  std::string line;
  int points = 0;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    double x = 0, y = 0;
    fields >> x >> y;
    EXPECT_LE(y, 415.0) << line;
    ++points;
  }
  EXPECT_EQ(points, 5);
  const std::string gp = file(files, "plots.gp");
  EXPECT_TRUE(contains(gp, "set ylabel 'address space per rank above start-up (MiB)'")) << gp;
  EXPECT_TRUE(contains(gp, "set arrow from graph 0, first 415 to graph 1, first 415 ")) << gp;
  EXPECT_TRUE(contains(gp, "'limit 415 MiB per rank'")) << gp;

  data.trials.push_back(cpu_trial(7, 4, "", 4096, 66 * kMiB, std::nullopt));
  files = make_plot_files(data);
  dat = file(files, "memory.dat");
  EXPECT_EQ(dat.rfind("# seqlen MiB trial_id: per rank, RSS above the start-up RSS", 0), 0u)
      << dat;
  EXPECT_FALSE(contains(dat, "limit")) << dat;
  EXPECT_FALSE(contains(file(files, "plots.gp"), "'limit 415 MiB per rank'"));
  EXPECT_TRUE(contains(dat, "\n18432 496 1\n")) << dat;
  EXPECT_TRUE(contains(files.plots[1].caption, "No limit is drawn")) << files.plots[1].caption;

  // Without a limit the address space caps nothing: the RSS is drawn, and no table adds it.
  data.trials = cpu_sweep();
  for (TrialRecord& t : data.trials) t.limit_bytes.reset();
  EXPECT_FALSE(limit_caps_address_space(data.trials));
  dat = file(make_plot_files(data), "memory.dat");
  EXPECT_EQ(dat.rfind("# seqlen MiB trial_id: per rank, RSS above the start-up RSS", 0), 0u)
      << dat;
  EXPECT_TRUE(contains(dat, "\n18432 496 1\n")) << dat;
}

// Step-time predictions say they are uncalibrated when no cost-model fit was stored before the
// sweep started; a fit stored before it makes them calibrated.
TEST(Printers, UncalibratedPredictionsAreFlagged) {
  SweepData data;
  data.sweep.name = "cpu";
  data.trials = cpu_sweep();
  const Table predictions = prediction_table(data.trials, data.time_calibrated);
  EXPECT_NE(std::find(predictions.header.begin(), predictions.header.end(),
                      "predicted ms (uncalibrated)"),
            predictions.header.end());
  const PlotFiles files = make_plot_files(data);
  EXPECT_TRUE(contains(file(files, "plots.gp"), "step time, uncalibrated"));
  EXPECT_TRUE(contains(render_readme(data, files.plots, "ulysses-tune report"),
                       "**The step-time predictions are uncalibrated**"));

  data.time_calibrated = true;
  EXPECT_NE(std::find(prediction_table(data.trials, true).header.begin(),
                      prediction_table(data.trials, true).header.end(), "predicted ms"),
            prediction_table(data.trials, true).header.end());
  EXPECT_FALSE(contains(render_readme(data, make_plot_files(data).plots, "r"), "uncalibrated"));

  // Which one a stored sweep is: a fit stored no later than the sweep was created.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("printers-fit-" + std::to_string(getpid()));
  ulysses::remove_tree(dir);
  std::filesystem::create_directories(dir);
  store::Store s = store::Store::open((dir / "results.db").string());
  store::SweepRecord sweep;
  sweep.created_at = "2026-01-01T00:00:00Z";
  EXPECT_FALSE(time_predictions_calibrated(s.db(), sweep));  // no fit at all
  store::CalibrationRun run;
  run.device = "cpu";
  s.add_calibration_run(run, {{0, store::kCostModelFitBenchmark, "ms_per_tflop", 1.0, "ms/TFLOP", "{}"}});
  // Times on either side of the fit's stored time (ISO 8601 UTC: text order is time order).
  const std::string fitted = s.calibration_runs().at(0).created_at;
  ASSERT_FALSE(fitted.empty());
  sweep.created_at = fitted;
  EXPECT_TRUE(time_predictions_calibrated(s.db(), sweep));  // stored no later than the sweep
  sweep.created_at = "0000";  // before any stored time: the fit came after the sweep began
  EXPECT_FALSE(time_predictions_calibrated(s.db(), sweep));
  ulysses::remove_tree(dir);
}

}  // namespace
}  // namespace ulysses::report
