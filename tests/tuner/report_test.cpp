// `ulysses-tune report`, `list` and `show` (tuner/report/) on a synthetic sweep: the CSV parses
// back to every trial (quoting included), the markdown tables hold the right cells, the four
// plots are PNGs, the Pareto front and the other analyses are right, and every error is one
// line, exit status 2, with no report directory and no database left behind.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "comm/exit_status.h"
#include "common/error.h"
#include "tests/tuner/report_test_util.h"
#include "tuner/report/plots.h"
#include "tuner/report/report_command.h"
#include "tuner/report/sweep_analysis.h"
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
  // Environment, flattened.
  EXPECT_EQ(markdown_row(readme, "host"), (std::vector<std::string>{"host", "node-7"}));
  EXPECT_EQ(markdown_row(readme, "devices.0.name"),
            (std::vector<std::string>{"devices.0.name", "cpu"}));
  // Search summary and the grid comparison.
  EXPECT_EQ(markdown_row(readme, "trials run"), (std::vector<std::string>{"trials run", "9"}));
  EXPECT_EQ(markdown_row(readme, "trials an exhaustive grid would run")[1], "24");
  EXPECT_EQ(markdown_row(readme, "fraction of the grid run")[1], "37.5 %");
  const auto best = markdown_row(readme, "best trial");
  ASSERT_EQ(best.size(), 2u);
  EXPECT_EQ(best[1].rfind("trial " + std::to_string(id("D")) + ": dp=2 sp=1 tiled_mlp=1", 0), 0u)
      << best[1];
  EXPECT_EQ(markdown_row(readme, "same_recommendation"),
            (std::vector<std::string>{"same_recommendation", "true"}));
  EXPECT_EQ(markdown_row(readme, "extra_key")[1], "kept");

  // Best per mesh: 1x2 fastest A, longest C; 2x1 fastest D, longest F (4096 at 700); 1x3 none.
  EXPECT_EQ(markdown_row(readme, "1x2"),
            (std::vector<std::string>{"1x2", "5", "3", "1000.0", "1024", "dp=1 sp=2 tiled_mlp=1",
                                      std::to_string(id("A")), "4096", "700.0"}));
  EXPECT_EQ(markdown_row(readme, "2x1")[3], "1100.0");
  EXPECT_EQ(markdown_row(readme, "2x1")[7], "4096");
  EXPECT_EQ(markdown_row(readme, "1x3")[5], "no trial measured");

  // The trials table: one row per trial.
  const auto oom = markdown_row(readme, std::to_string(id("H")));
  ASSERT_EQ(oom.size(), 10u);
  EXPECT_EQ(oom[1], "oom");
  EXPECT_EQ(oom[2], "1x2");
  EXPECT_EQ(oom[3], "16384");
  EXPECT_EQ(oom[4], "2");  // the tiled_mlp axis
  EXPECT_EQ(oom[7], "9.00");
  EXPECT_EQ(oom[8], "8.00");
  EXPECT_EQ(oom[9], "out of memory: \"CUDA\", tried to allocate 2.00 GiB, at layer 3");
  EXPECT_EQ(markdown_row(readme, std::to_string(id("G")))[1], "ok (probe)");
  const auto a = markdown_row(readme, std::to_string(id("A")));
  EXPECT_EQ(a[5], "1000.0");
  EXPECT_EQ(a[6], "100.0");
  EXPECT_EQ(markdown_row(readme, std::to_string(id("J")))[9],
            "mesh.sp=3: does not divide 8 heads \\| kv heads");
  for (const auto& t : trials_) {
    EXPECT_FALSE(markdown_row(readme, std::to_string(t.id)).empty()) << "trial " << t.id;
  }
  EXPECT_NE(readme.find("```yaml\nname: synthetic\n"), std::string::npos);
}

TEST_F(ReportFixture, FourPlotsArePngs) {
  if (!find_gnuplot("")) GTEST_SKIP() << "gnuplot is not installed";
  const fs::path out = dir_ / "report";
  ASSERT_EQ(run_report(options(out)), 0);
  const std::string readme = read(out / "README.md");
  for (const char* png : {"throughput_vs_seqlen.png", "memory_vs_seqlen.png", "time_breakdown.png",
                          "pareto_front.png"}) {
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
  // Stacked bars: compute 50, comm 20, offload 5, optimizer 5, other 100 - 80.
  EXPECT_NE(
      read(out / "phases.dat").find(std::to_string(id("A")) + ": 1x2 sl=1024\" 50 20 5 5 20 "),
      std::string::npos);
}

}  // namespace
}  // namespace ulysses::report
