// `ulysses-tune report`, `list` and `show` (tuner/report/) on a synthetic sweep: the CSV parses
// back to every trial (quoting included), the markdown tables hold the right cells, the five
// plots are PNGs, the Pareto front and the other analyses are right, every error is one line,
// exit status 2, with no report directory and no database left behind; the plots draw peaks on
// the basis of their limit line and keep every point inside their axes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "comm/exit_status.h"
#include "common/error.h"
#include "tests/tuner/report_test_util.h"
#include "tuner/results/format.h"
#include "tuner/results/memory_basis.h"
#include "tuner/report/plot_script.h"
#include "tuner/report/plots.h"
#include "tuner/report/report_command.h"
#include "tuner/results/sweep_analysis.h"
#include "tuner/report/trial_table.h"

namespace fs = std::filesystem;

namespace ulysses::report {
namespace {

using testing::ReportFixture;

constexpr char kPngSignature[] = "\x89PNG\r\n\x1a\n";

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// RFC 4180, strictly: CRLF record ends, quotes doubled inside quoted fields.
std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> records;
  std::vector<std::string> record;
  std::string field;
  bool quoted = false, was_quoted = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c != '"') {
        field += c;
      } else if (i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else {
        quoted = false;
      }
    } else if (c == '"') {
      EXPECT_TRUE(field.empty() && !was_quoted) << "quote inside an unquoted field";
      quoted = was_quoted = true;
    } else if (c == ',') {
      record.push_back(std::move(field));
      field.clear();
      was_quoted = false;
    } else if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') {
      record.push_back(std::move(field));
      records.push_back(std::move(record));
      field.clear();
      record.clear();
      was_quoted = false;
      ++i;
    } else {
      EXPECT_NE(c, '\n') << "bare LF outside quotes at byte " << i;
      field += c;
    }
  }
  EXPECT_FALSE(quoted) << "unterminated quoted field";
  EXPECT_TRUE(field.empty() && record.empty()) << "last record without CRLF";
  return records;
}

// The cells of the markdown table row whose first cell is `first`, trimmed; empty when there is
// none. Escaped bars ("\\|") stay inside their cell.
std::vector<std::string> markdown_row(const std::string& markdown, const std::string& first) {
  std::istringstream lines(markdown);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| " + first + " |", 0) != 0 || line.size() < 4) continue;
    std::string inner = line.substr(2, line.size() - 4);  // without "| " and " |"
    std::vector<std::string> cells;
    for (size_t bar; (bar = inner.find(" | ")) != std::string::npos;
         inner = inner.substr(bar + 3)) {
      cells.push_back(inner.substr(0, bar));
    }
    cells.push_back(inner);
    for (auto& cell : cells) {
      cell.erase(0, cell.find_first_not_of(' '));
      cell.erase(cell.find_last_not_of(' ') + 1);
    }
    return cells;
  }
  return {};
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The content of `name` among the plot files ("" when absent).
std::string plot_file(const PlotFiles& files, const std::string& name) {
  for (const auto& [file, content] : files.files) {
    if (file == name) return content;
  }
  return "";
}

// The commands of plots.gp that draw `png`: from its `set output` to the next plot's reset.
std::string plot_block(const std::string& gp, const std::string& png) {
  const size_t begin = gp.find("set output '" + png + "'");
  if (begin == std::string::npos) return "";
  return gp.substr(begin, gp.find("\nreset\n", begin) - begin);
}

// [lo, hi] of `set <axis>range [lo:hi]` in a plot's commands; NaN when not set to two numbers.
std::pair<double, double> axis_range(const std::string& block, const std::string& axis) {
  const std::string key = "set " + axis + "range [";
  const size_t at = block.find(key);
  if (at == std::string::npos) return {NAN, NAN};
  char* end = nullptr;
  const char* text = block.c_str() + at + key.size();
  const double lo = std::strtod(text, &end);
  if (end == text || *end != ':') return {NAN, NAN};
  const char* high = end + 1;
  const double hi = std::strtod(high, &end);
  if (end == high || *end != ']') return {NAN, NAN};
  return {lo, hi};
}

// The numbers of a .dat file's data lines (comments and blank lines skipped); a leading quoted
// label is dropped and "?" (missing) reads as NaN.
std::vector<std::vector<double>> dat_rows(const std::string& dat) {
  std::vector<std::vector<double>> rows;
  std::istringstream lines(dat);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '"') line = line.substr(line.find('"', 1) + 1);
    std::istringstream words(line);
    std::vector<double> row;
    for (std::string word; words >> word;) row.push_back(word == "?" ? NAN : std::stod(word));
    rows.push_back(row);
  }
  return rows;
}

// Expects `value` inside `range` and at least 2 % of its span (in log2 on a log axis) from either
// end, so that a point's marker is not cut by the frame. NaN (a missing value) passes.
void expect_inside(double value, std::pair<double, double> range, bool log_axis,
                   const std::string& what) {
  if (std::isnan(value)) return;
  auto at = [&](double v) { return log_axis ? std::log2(v) : v; };
  const double lo = at(range.first), hi = at(range.second), v = at(value);
  ASSERT_FALSE(std::isnan(lo) || std::isnan(hi)) << what << ": no numeric range";
  const double margin = 0.02 * (hi - lo);
  EXPECT_GE(v, lo + margin) << what << " " << value << " below [" << range.first << ":"
                            << range.second << "]";
  EXPECT_LE(v, hi - margin) << what << " " << value << " above [" << range.first << ":"
                            << range.second << "]";
}

// A CPU sweep like the quickstart: 0.108 GiB per rank (0.12 less the head-room) and trials whose
// whole-process peaks, 0.14 to 0.21 GiB, lie above it although each of them fit (their address
// space, which the limit caps, stayed under it). Three meshes x
// lengths 256..4096 (a log axis), one very slow trial (near the bottom of the throughput plots),
// predictions off by -70 % to +60 % (beyond the bands), a probe, an OOM with a peak and one
// without.
SweepData cpu_sweep() {
  SweepData data;
  data.sweep.name = "cpu-like";
  const int64_t limit = static_cast<int64_t>(0.108 * kGiB);
  int64_t id = 0;
  auto add = [&](int64_t sp, int64_t length, const std::string& status) -> TrialRecord& {
    TrialRecord t;
    t.id = ++id;
    t.sp = sp;
    t.dp = 4 / sp;
    t.world_size = 4;
    t.seqlen = length;
    t.status = status;
    t.limit_bytes = limit;
    t.point = R"({"mesh.sp":)" + std::to_string(sp) + "}";
    // An ok trial recorded the address space the limit caps: under the limit, whatever its RSS.
    t.summary = status == "ok" ? R"({"device":"cpu","max_rank_peak_address_space_bytes":)" +
                                     std::to_string(limit * (50 + id) / 100) + "}"
                               : "{}";
    data.trials.push_back(t);
    return data.trials.back();
  };
  for (int64_t sp : {1, 2, 4}) {
    for (int64_t length : {256, 512, 1024, 2048, 4096}) {
      TrialRecord& t = add(sp, length, "ok");
      const double scale = static_cast<double>(length) / 4096.0;
      t.exit_code = 0;
      t.tokens_per_s_per_rank = 1000.0 / static_cast<double>(sp) * (1.0 + scale);
      t.step_ms = 100.0 * (1.0 + scale);
      t.peak_mem_bytes = static_cast<int64_t>((0.14 + 0.07 * scale) * kGiB);
      t.predicted_peak_bytes = static_cast<int64_t>(*t.peak_mem_bytes * (0.9 + 0.1 * sp));
      t.predicted_step_ms = *t.step_ms * (0.3 + 0.3 * static_cast<double>(sp) * scale);
    }
  }
  data.trials[3].tokens_per_s_per_rank = 5.0;  // very slow
  TrialRecord& probe = add(1, 4096, "ok");
  probe.probe = true;
  probe.peak_mem_bytes = static_cast<int64_t>(0.2 * kGiB);
  probe.predicted_peak_bytes = static_cast<int64_t>(0.25 * kGiB);
  add(2, 4096, "oom").peak_mem_bytes = static_cast<int64_t>(0.26 * kGiB);
  add(4, 3072, "oom");  // no peak: drawn at its limit
  return data;
}

TEST(Plots, ATrialThatFitIsDrawnUnderItsLimitLine) {
  const SweepData data = cpu_sweep();
  const PlotFiles files = make_plot_files(data);
  const std::string memory = plot_block(plot_file(files, "plots.gp"), "memory_vs_seqlen.png");
  const std::string limit_arrow = "set arrow from graph 0, first ";
  ASSERT_NE(memory.find(limit_arrow), std::string::npos) << memory;
  const double limit_y = std::stod(memory.substr(memory.find(limit_arrow) + limit_arrow.size()));
  // In MiB, as the points: every value is under 1 GiB.
  EXPECT_NEAR(limit_y, static_cast<double>(static_cast<int64_t>(0.108 * kGiB)) / (1 << 20), 1e-9);
  EXPECT_EQ(plot_file(files, "memory.dat").rfind("# seqlen MiB trial_id", 0), 0u);
  std::map<int64_t, const TrialRecord*> by_id;
  for (const TrialRecord& t : data.trials) by_id[t.id] = &t;
  int fit = 0, oom = 0;
  for (const auto& row : dat_rows(plot_file(files, "memory.dat"))) {
    ASSERT_EQ(row.size(), 3u);
    const TrialRecord& t = *by_id.at(static_cast<int64_t>(row[2]));
    if (t.status == "oom") {  // on the limit it exceeded, whatever peak it measured before
      EXPECT_NEAR(row[1], limit_y, 1e-9) << "trial " << t.id;
      ++oom;
    }
    if (t.status != "ok") continue;
    ++fit;
    // What the limit caps on CPU is address space, not the resident peak (0.14..0.21 GiB).
    EXPECT_LT(row[1], limit_y) << "trial " << t.id << " fit but is drawn above the limit";
    EXPECT_NEAR(row[1], *capped_peak(t) / kGiB * 1024, 1e-9) << "trial " << t.id;
  }
  EXPECT_EQ(fit, 16);  // 15 trials and the probe
  EXPECT_EQ(oom, 2);
  // The quantity is named on the plot.
  EXPECT_NE(memory.find("address space above each rank''s start-up address space: what "
                        "memory.limit_gib caps on CPU (RLIMIT_AS)"),
            std::string::npos)
      << memory;
}

TEST(Plots, EveryPointLiesInsideItsAxes) {
  const PlotFiles files = make_plot_files(cpu_sweep());
  const std::string gp = plot_file(files, "plots.gp");
  // Length on x (log: 256..4096), the value on y.
  for (const auto& [png, dat] : {std::pair{"throughput_vs_seqlen.png", "throughput.dat"},
                                 std::pair{"memory_vs_seqlen.png", "memory.dat"},
                                 std::pair{"pareto_front.png", "pareto.dat"}}) {
    const std::string block = plot_block(gp, png);
    ASSERT_FALSE(block.empty()) << png;
    EXPECT_NE(block.find("set logscale x 2"), std::string::npos) << png;
    for (const auto& row : dat_rows(plot_file(files, dat))) {
      expect_inside(row[0], axis_range(block, "x"), /*log_axis=*/true, std::string(png) + " x");
      expect_inside(row[1], axis_range(block, "y"), false, std::string(png) + " y");
    }
  }
  // The memory plot's limit line is inside too.
  expect_inside(0.108 * 1024, axis_range(plot_block(gp, "memory_vs_seqlen.png"), "y"), false,
                "limit");
  // Stacked bars: the tallest stack below the top (bars start at 0, on the frame).
  const auto bars = axis_range(plot_block(gp, "time_breakdown.png"), "y");
  for (const auto& row : dat_rows(plot_file(files, "phases.dat"))) {
    EXPECT_LT(row[0] + row[1] + row[2] + row[3] + row[4], 0.98 * bars.second);
    EXPECT_LE(bars.first, 0.0);
  }
  // Errors per trial: the row index on x, memory and step-time errors on y.
  const std::string prediction = plot_block(gp, "prediction_error.png");
  const auto rows = dat_rows(plot_file(files, "prediction.dat"));
  ASSERT_EQ(rows.size(), 16u);  // the ok trials, probe included (memory only)
  for (size_t i = 0; i < rows.size(); ++i) {
    expect_inside(static_cast<double>(i), axis_range(prediction, "x"), false, "prediction x");
    expect_inside(rows[i][0], axis_range(prediction, "y"), false, "memory error");
    expect_inside(rows[i][1], axis_range(prediction, "y"), false, "step time error");
  }
  // The +-20 % bands are inside as well.
  expect_inside(-20, axis_range(prediction, "y"), false, "band");
  expect_inside(20, axis_range(prediction, "y"), false, "band");
}

TEST(Plots, LabelsDoNotOverlap) {
  const std::string gp = plot_file(make_plot_files(cpu_sweep()), "plots.gp");
  // Pareto points carry no labels (the README lists the front); 16 trials: every one labelled.
  EXPECT_EQ(plot_block(gp, "pareto_front.png").find("with labels"), std::string::npos);
  EXPECT_NE(plot_block(gp, "time_breakdown.png").find("using 2:xtic(1) "), std::string::npos);
  EXPECT_NE(plot_block(gp, "prediction_error.png").find("using 0:2:xtic(1) "), std::string::npos);
  // 300 trials do not fit one label each into the widest plot: one in k is labelled.
  SweepData many = cpu_sweep();
  for (int i = 0; i < 300; ++i) {
    TrialRecord t = many.trials.front();
    t.id = 1000 + i;
    many.trials.push_back(t);
  }
  const std::string crowded = plot_file(make_plot_files(many), "plots.gp");
  for (const char* png : {"time_breakdown.png", "prediction_error.png"}) {
    const std::string block = plot_block(crowded, png);
    EXPECT_NE(block.find("xtic(int($0) % "), std::string::npos) << png << "\n" << block;
    EXPECT_NE(block.find(" labelled): mesh dp x sp"), std::string::npos) << png;
  }
}

// cpu_sweep() as run on two core slots, two trials at a time: trial i starts at 10 s x (i / 2)
// on slot i % 2 and runs for 9 s (the timestamps whole seconds, as the sweep stores them); trials
// 1-12 ran beside their partner, the rest alone; then a configuration re-measured alone on both
// cores at 100 s for 12 s, and a pruned trial (never started: no bar).
SweepData slotted_sweep() {
  SweepData data = cpu_sweep();
  for (size_t i = 0; i < data.trials.size(); ++i) {
    TrialRecord& t = data.trials[i];
    t.slot = i % 2 == 0 ? "cores 0-0" : "cores 1-1";
    char start[32];
    std::snprintf(start, sizeof start, "2026-11-28T23:%02d:%02dZ",
                  static_cast<int>(10 * (i / 2) / 60), static_cast<int>(10 * (i / 2) % 60));
    t.started_at = start;
    t.wall_s = 9.0;
  }
  for (size_t i = 0; i + 1 < data.trials.size(); i += 2) {  // pairs that overlapped
    const int64_t a = data.trials[i].id, b = data.trials[i + 1].id;
    if (b > 12) break;
    data.neighbours[a].push_back(b), data.neighbours[b].push_back(a);
  }
  TrialRecord again = data.trials.front();
  again.id = 100;
  again.remeasure_of = data.trials.front().id;
  again.slot = "cores 0-1";
  again.started_at = "2026-11-28T23:01:40Z";
  again.wall_s = 12.0;
  data.trials.push_back(again);
  TrialRecord pruned;
  pruned.id = 101;
  pruned.status = "pruned";
  data.trials.push_back(pruned);
  return data;
}

// The blocks of a .dat file: (its "# title" line, its data rows).
std::vector<std::pair<std::string, std::vector<std::vector<double>>>> dat_blocks(
    const std::string& dat) {
  std::vector<std::pair<std::string, std::vector<std::vector<double>>>> blocks;
  size_t at = dat.find('\n') + 1;  // the file's header line
  while (at < dat.size()) {
    const size_t end = std::min(dat.find("\n\n\n", at), dat.size());
    const std::string text = dat.substr(at, end - at + 1);
    const size_t title_end = text.find('\n');
    blocks.emplace_back(text.substr(2, title_end - 2), dat_rows(text.substr(title_end + 1)));
    at = end + 3;
  }
  return blocks;
}

TEST(Plots, TheTimelineDrawsEachTrialOnItsSlotOverTime) {
  // A sweep that ran one trial at a time has no timeline.
  const PlotFiles serial = make_plot_files(cpu_sweep());
  for (const Plot& p : serial.plots) EXPECT_NE(p.file, "timeline.png");
  EXPECT_EQ(plot_file(serial, "timeline.dat"), "");

  const SweepData data = slotted_sweep();
  const PlotFiles files = make_plot_files(data);
  const auto plot = std::find_if(files.plots.begin(), files.plots.end(),
                                 [](const Plot& p) { return p.file == "timeline.png"; });
  ASSERT_NE(plot, files.plots.end());
  EXPECT_EQ(plot->omitted, "");
  const std::string block = plot_block(plot_file(files, "plots.gp"), "timeline.png");
  // Slots in the order of their first trial, as labelled rows 0, 1, 2.
  EXPECT_NE(block.find("set ytics ('cores 0-0' 0, 'cores 1-1' 1, 'cores 0-1' 2)"),
            std::string::npos)
      << block;
  std::map<int64_t, const TrialRecord*> by_id;
  for (const TrialRecord& t : data.trials) by_id[t.id] = &t;
  const char* slots[] = {"cores 0-0", "cores 1-1", "cores 0-1"};
  int bars = 0, labels = 0;
  for (const auto& [title, rows] : dat_blocks(plot_file(files, "timeline.dat"))) {
    for (const auto& row : rows) {
      if (title.rfind("labels", 0) == 0) {  // x row id: inside its bar
        ASSERT_EQ(row.size(), 3u);
        ++labels;
        expect_inside(row[0], axis_range(block, "x"), false, "label x");
        continue;
      }
      ASSERT_EQ(row.size(), 4u) << title;
      const TrialRecord& t = *by_id.at(static_cast<int64_t>(row[3]));
      ++bars;
      EXPECT_EQ(title, t.remeasure_of ? "ok, re-measured alone" : t.status) << t.id;
      EXPECT_EQ(t.slot, slots[static_cast<int>(row[0])]) << t.id;
      // Seconds since the first start (23:00:00); each bar as long as the trial's wall time.
      const int64_t index = t.id == 100 ? -1 : t.id - 1;
      const double start = index < 0 ? 100.0 : 10.0 * static_cast<double>(index / 2);
      EXPECT_DOUBLE_EQ(row[1], start) << t.id;
      EXPECT_DOUBLE_EQ(row[2] - row[1], *t.wall_s) << t.id;
      expect_inside(row[1], axis_range(block, "x"), false, "timeline start");
      expect_inside(row[2], axis_range(block, "x"), false, "timeline end");
      expect_inside(row[0], axis_range(block, "y"), false, "timeline row");
    }
  }
  EXPECT_EQ(bars, static_cast<int>(data.trials.size()) - 1);  // all but the pruned one
  EXPECT_EQ(labels, bars);  // 9 s of 112 s is wide enough for a label
  EXPECT_NE(block.find("fs pattern"), std::string::npos) << "the re-measure is not hatched";
  // 16 measured trials (ok, not probes; the re-measure included), 1-12 beside another.
  EXPECT_NE(plot->caption.find("12 of 16 measured trials ran beside another trial."),
            std::string::npos)
      << plot->caption;

  // gnuplot draws it (ULYSSES_KEEP_TEST_DIR=1 keeps the picture).
  if (!find_gnuplot("")) GTEST_SKIP() << "gnuplot is not installed";
  const fs::path dir = fs::temp_directory_path() / ("timeline-test-" + std::to_string(getpid()));
  fs::create_directories(dir);
  write_plots(data, dir.string(), find_gnuplot(""));
  const std::string png = read(dir / "timeline.png");
  EXPECT_GT(png.size(), 1000u);
  EXPECT_EQ(png.substr(0, 8), std::string(kPngSignature, 8));
  if (std::getenv("ULYSSES_KEEP_TEST_DIR")) {
    std::cerr << "kept " << dir << "\n";
  } else {
    ulysses::remove_tree(dir);
  }
}

TEST_F(ReportFixture, CsvParsesBackToEveryTrialWithItsQuoting) {
  const fs::path out = dir_ / "reports" / "synthetic";
  ASSERT_EQ(run_report(options(out)), 0);
  const std::string csv = read(out / "trials.csv");
  const auto records = parse_csv(csv);
  ASSERT_EQ(records.size(), trials_.size() + 1);

  // The header is the store's trials table, column for column.
  std::vector<std::string> columns;
  {
    store::Database db = store::Database::open(db_path_, store::Database::Mode::kReadOnly);
    store::Statement s = db.prepare("SELECT name FROM pragma_table_info('trials') ORDER BY cid");
    while (s.step()) columns.push_back(s.column_text(0));
  }
  EXPECT_EQ(records[0], columns);
  auto column = [&](const std::string& name) {
    return static_cast<size_t>(std::find(columns.begin(), columns.end(), name) - columns.begin());
  };
  for (size_t i = 0; i < trials_.size(); ++i) {
    const auto& record = records[i + 1];
    const store::TrialRecord& t = trials_[i];
    ASSERT_EQ(record.size(), columns.size()) << "row " << i;
    EXPECT_EQ(record[column("id")], std::to_string(t.id));
    EXPECT_EQ(record[column("status")], t.status);
    EXPECT_EQ(record[column("error")], t.error);
    EXPECT_EQ(record[column("reason")], t.reason);
    EXPECT_EQ(record[column("point")], t.point);
    EXPECT_EQ(record[column("config_yaml")], t.config_yaml);
    EXPECT_EQ(record[column("probe")], t.probe ? "1" : "0");
    EXPECT_EQ(record[column("seqlen")], std::to_string(t.seqlen));
    // Optional numbers: "" for NULL, else text that parses back to the stored value exactly.
    for (const auto& [name, value] :
         {std::pair{"tokens_per_s_per_rank", t.tokens_per_s_per_rank},
          std::pair{"step_ms", t.step_ms}, std::pair{"final_loss", t.final_loss}}) {
      const std::string& cell = record[column(name)];
      if (!value) {
        EXPECT_EQ(cell, "") << name << " of trial " << t.id;
      } else {
        EXPECT_EQ(std::strtod(cell.c_str(), nullptr), *value) << name << " of trial " << t.id;
      }
    }
    const std::string peak = record[column("peak_mem_bytes")];
    EXPECT_EQ(peak, t.peak_mem_bytes ? std::to_string(*t.peak_mem_bytes) : "");
    EXPECT_EQ(record[column("exit_code")], t.exit_code ? std::to_string(*t.exit_code) : "");
  }
  // The OOM error holds a comma, quotes and a line break: it must have been quoted.
  EXPECT_NE(csv.find("\"out of memory: \"\"CUDA\"\", tried to allocate 2.00 GiB,\nat layer 3\""),
            std::string::npos);
}

TEST_F(ReportFixture, MarkdownTablesHoldTheSweep) {
  const fs::path out = dir_ / "report";
  ASSERT_EQ(run_report(options(out)), 0);
  const std::string readme = read(out / "README.md");
  EXPECT_EQ(readme.rfind("# Sweep `synthetic`\n", 0), 0u) << readme.substr(0, 200);
  EXPECT_NE(readme.find("--sweep synthetic"), std::string::npos);

  EXPECT_EQ(markdown_row(readme, "experiment"),
            (std::vector<std::string>{"experiment", "`experiments/synthetic.yaml`"}));
  EXPECT_EQ(markdown_row(readme, "trials")[1], "11: ok 7, oom 1, timeout 1, pruned 1, invalid 1");
  EXPECT_EQ(markdown_row(readme, "machine load while trials ran")[1],
            "not recorded (the sweep was run by a ulysses-tune that did not record it)");
  // The basis of every peak, stated once: above the start-up baseline, which on CPU is estimated.
  EXPECT_NE(readme.find("**Memory.** Peak memory is per rank and above the rank's start-up "
                        "baseline"),
            std::string::npos);
  EXPECT_NE(readme.find("the cost model's estimate (its runtime term), a baseline of " +
                        memory_size(memory_baseline_bytes("cpu")) + ", stands in."),
            std::string::npos);
  // Environment, flattened.
  EXPECT_EQ(markdown_row(readme, "host"), (std::vector<std::string>{"host", "node-7"}));
  EXPECT_EQ(markdown_row(readme, "devices.0.name"),
            (std::vector<std::string>{"devices.0.name", "cpu"}));
  // Search summary and the grid comparison.
  EXPECT_EQ(markdown_row(readme, "trials run"), (std::vector<std::string>{"trials run", "9"}));
  EXPECT_EQ(markdown_row(readme, "trials an exhaustive grid would run")[1], "24");
  EXPECT_EQ(markdown_row(readme, "fraction of the grid run")[1], "37.5 %");
  // The best trial is the objective's (max-seqlen): C, not the fastest trial D.
  const auto best = markdown_row(readme, "best trial (objective max-seqlen)");
  ASSERT_EQ(best.size(), 2u) << readme;
  EXPECT_EQ(best[1], "trial " + std::to_string(id("C")) +
                         ": dp=1 sp=2 tiled_mlp=1, seqlen 4096, 700.0 tokens/s per rank");
  EXPECT_EQ(markdown_row(readme, "same_recommendation"),
            (std::vector<std::string>{"same_recommendation", "true"}));
  EXPECT_EQ(markdown_row(readme, "extra_key")[1], "kept");

  // Per mesh: 1x2 fastest A, longest C; 2x1 fastest D, longest F (4096 at 700); 1x3 none.
  EXPECT_EQ(markdown_row(readme, "1x2"),
            (std::vector<std::string>{"1x2", "5", "3", "1000.0", "1024", "dp=1 sp=2 tiled_mlp=1",
                                      std::to_string(id("A")), "4096", "700.0"}));
  EXPECT_EQ(markdown_row(readme, "2x1")[3], "1100.0");
  EXPECT_EQ(markdown_row(readme, "2x1")[7], "4096");
  EXPECT_EQ(markdown_row(readme, "1x3")[5], "no trial measured");

  // The cost model beside the measurement, both peaks above the same baseline.
  const std::string model = readme.substr(readme.find("## Cost model"));
  const int64_t baseline = memory_baseline_bytes("cpu");
  const int64_t peak_bytes = (int64_t{256} << 20) - baseline;
  const int64_t predicted_bytes = (int64_t{300} << 20) - baseline;
  const double peak = static_cast<double>(peak_bytes), predicted = static_cast<double>(predicted_bytes);
  EXPECT_EQ(markdown_row(model, std::to_string(id("A"))),
            (std::vector<std::string>{std::to_string(id("A")), "1x2", "1024", "no",
                                      memory_size(peak_bytes), memory_size(predicted_bytes),
                                      "+" + fixed(100 * (predicted - peak) / peak, 1) + " %",
                                      "100.0", "160.0", "+60.0 %"}));
  // The trials table: one row per trial.
  const std::string trials = readme.substr(readme.find("## Trials"));
  const auto oom = markdown_row(trials, std::to_string(id("H")));
  ASSERT_EQ(oom.size(), 11u);
  EXPECT_EQ(oom[1], "oom");
  EXPECT_EQ(oom[2], "1x2");
  EXPECT_EQ(oom[3], "16384");
  EXPECT_EQ(oom[4], "2");  // the tiled_mlp axis
  // 9 GiB of resident set less the CPU start-up baseline (the cost model's estimate)
  EXPECT_EQ(oom[7], memory_size((int64_t{9} << 30) - memory_baseline_bytes("cpu")));
  EXPECT_EQ(oom[8], "");          // no address space recorded (no summary.json)
  EXPECT_EQ(oom[9], "8.00 GiB");
  EXPECT_EQ(oom[10], "out of memory: \"CUDA\", tried to allocate 2.00 GiB, at layer 3");
  EXPECT_EQ(markdown_row(trials, std::to_string(id("G")))[1], "ok (probe)");
  const auto a = markdown_row(trials, std::to_string(id("A")));
  EXPECT_EQ(a[5], "1000.0");
  EXPECT_EQ(a[6], "100.0");
  EXPECT_EQ(markdown_row(trials, std::to_string(id("J")))[10],
            "mesh.sp=3: does not divide 8 heads \\| kv heads");
  for (const auto& t : trials_) {
    EXPECT_FALSE(markdown_row(trials, std::to_string(t.id)).empty()) << "trial " << t.id;
  }
  EXPECT_NE(readme.find("```yaml\nname: synthetic\n"), std::string::npos);
}

TEST_F(ReportFixture, EveryPlotIsAPng) {
  if (!find_gnuplot("")) GTEST_SKIP() << "gnuplot is not installed";
  const fs::path out = dir_ / "report";
  ASSERT_EQ(run_report(options(out)), 0);
  const std::string readme = read(out / "README.md");
  for (const char* png : {"throughput_vs_seqlen.png", "memory_vs_seqlen.png", "time_breakdown.png",
                          "pareto_front.png", "prediction_error.png"}) {
    const std::string bytes = read(out / png);
    EXPECT_GT(bytes.size(), 1000u) << png;
    EXPECT_EQ(bytes.substr(0, 8), std::string(kPngSignature, 8)) << png;
    EXPECT_NE(readme.find(std::string("](") + png + ")"), std::string::npos) << png;
  }
  EXPECT_TRUE(fs::is_regular_file(out / "plots.gp"));
  EXPECT_FALSE(fs::exists(out / "gnuplot.log"));
  EXPECT_EQ(readme.find("Not drawn"), std::string::npos);
  // The front in the data file: D, B, C (probe G and the dominated ones left out).
  const std::string pareto = read(out / "pareto.dat");
  const std::string front = pareto.substr(pareto.find("\n\n\n") + 3);
  EXPECT_EQ(front, "1024 1100 " + std::to_string(id("D")) + "\n2048 900 " +
                       std::to_string(id("B")) + "\n4096 700 " + std::to_string(id("C")) + "\n");
  // The plot labels no point; the README lists the front's trials under it.
  EXPECT_NE(readme.find("| " + std::to_string(id("D")) + " | 1024 | 1100.0 | dp=2 sp=1 "
                        "tiled_mlp=1 |\n| " + std::to_string(id("B")) + " | 2048 | 900.0 | dp=1 "
                        "sp=2 tiled_mlp=1 |\n| " + std::to_string(id("C")) +
                        " | 4096 | 700.0 | dp=1 sp=2 tiled_mlp=1 |\n"),
            std::string::npos)
      << readme;
  // Stacked bars: compute 50, comm 20, offload 5, optimizer 5, other 100 - 80.
  EXPECT_NE(
      read(out / "phases.dat").find(std::to_string(id("A")) + ": 1x2 sl=1024\" 50 20 5 5 20 "),
      std::string::npos);
}

}  // namespace
}  // namespace ulysses::report
