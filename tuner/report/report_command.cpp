// `ulysses-tune report`: sweep -> README.md + trials.csv + plots, written beside --out and renamed.
#include "tuner/report/report_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "common/error.h"
#include "tuner/report/plots.h"
#include "tuner/report/report_writer.h"
#include "tuner/report/sweep_source.h"
#include "tuner/report/trial_table.h"
#include "common/remove_tree.h"

namespace fs = std::filesystem;

namespace ulysses::report {
namespace {

std::string shell_word(const std::string& word) {
  if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                              "0123456789-_./=:@%+,") == std::string::npos) {
    return word;
  }
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

void write_file(const fs::path& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
  if (!out.flush()) throw UserError(path.string() + ": cannot write");
}

// --out as a directory path without a trailing separator.
fs::path out_path(const ReportOptions& options, const std::string& sweep_name) {
  fs::path out =
      options.out_dir.empty() ? fs::path("reports") / sweep_name : fs::path(options.out_dir);
  while (!out.empty() && out.filename().empty()) out = out.parent_path();
  if (out.empty()) throw UserError("--out " + options.out_dir + ": not a directory name");
  return out;
}

// An existing --out may be replaced when it is an empty directory or a report.
void check_replaceable(const fs::path& out, const std::string& flag_value) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(out, ec))) return;
  if (!fs::is_directory(out, ec))
    throw UserError("--out " + flag_value + ": exists and is not a directory");
  if (!fs::is_empty(out, ec) && !fs::is_regular_file(out / "README.md", ec)) {
    throw UserError("--out " + flag_value +
                    ": exists and holds no report (no README.md); remove it or choose another");
  }
}

// Removes the temporary directory unless the report was moved into place.
struct TempDir {
  fs::path path;
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) ulysses::remove_tree(path);
  }
};

}  // namespace

CLI::App* add_report_command(CLI::App& app, ReportOptions* options) {
  CLI::App* cmd = app.add_subcommand(
      "report", "Write a sweep's report: README.md (tables, plots), trials.csv, PNG plots");
  cmd->add_option("--db", options->db_path, "results database (read only)")->capture_default_str();
  cmd->add_option("--sweep", options->sweep, "sweep name (default: the latest sweep)");
  cmd->add_option("--out", options->out_dir,
                  "report directory, replaced if it holds a report (default: reports/<sweep>)");
  cmd->add_option("--gnuplot", options->gnuplot,
                  "gnuplot executable (default: $GNUPLOT, else gnuplot on PATH)");
  return cmd;
}

int run_report(const ReportOptions& options) {
  const std::optional<std::string> gnuplot = find_gnuplot(options.gnuplot);
  store::Database db = open_results(options.db_path);
  const SweepData data = load_sweep(db, options.sweep);
  const fs::path out = out_path(options, data.sweep.name);
  check_replaceable(out, options.out_dir.empty() ? out.string() : options.out_dir);

  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(parent, ec);
  const std::string tag = std::to_string(getpid());
  TempDir temp{parent / ("." + out.filename().string() + ".tmp-" + tag)};
  ulysses::remove_tree(temp.path);
  if (!fs::create_directory(temp.path, ec)) {
    throw UserError("--out " + out.string() + ": cannot create " + temp.path.string() + " (" +
                    ec.message() + ")");
  }

  const std::string command = "ulysses-tune report --db " + shell_word(options.db_path) +
                              " --sweep " + shell_word(data.sweep.name) + " --out " +
                              shell_word(out.string());
  const std::vector<Plot> plots = write_plots(data, temp.path.string(), gnuplot);
  write_file(temp.path / "trials.csv", render_csv(trial_fields_table(data.trials)));
  write_file(temp.path / "README.md", render_readme(data, plots, command));

  // Into place: an earlier report moves aside first and is removed once the new one is there.
  TempDir old;
  if (fs::exists(fs::symlink_status(out, ec))) {
    old.path = parent / ("." + out.filename().string() + ".old-" + tag);
    ulysses::remove_tree(old.path);
    fs::rename(out, old.path);
  }
  try {
    fs::rename(temp.path, out);
  } catch (...) {
    if (!old.path.empty()) fs::rename(old.path, out, ec);  // the earlier report goes back
    old.path.clear();
    throw;
  }
  temp.path.clear();

  int drawn = 0;
  for (const Plot& plot : plots) drawn += plot.omitted.empty() ? 1 : 0;
  std::cout << "report: wrote " << (out / "README.md").string() << " (" << data.trials.size()
            << " trials, " << drawn << " of " << plots.size() << " plots drawn)" << std::endl;
  return 0;
}

}  // namespace ulysses::report
