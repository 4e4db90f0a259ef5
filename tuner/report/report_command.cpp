// `ulysses-tune report`: sweep -> README.md + trials.csv + plots, written beside --out and renamed.
#include "tuner/report/report_command.h"

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "common/error.h"
#include "common/output_dir.h"
#include "common/shell_quote.h"
#include "tuner/report/plots.h"
#include "tuner/report/report_writer.h"
#include "tuner/results/sweep_source.h"
#include "tuner/report/trial_table.h"

namespace fs = std::filesystem;

namespace ulysses::report {
namespace {

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

}  // namespace

CLI::App* add_report_command(CLI::App& app, ReportOptions* options) {
  CLI::App* cmd = app.add_subcommand(
      "report", "Write a sweep's report: README.md (tables, plots), trials.csv, PNG plots");
  cmd->add_option("--db", options->db_path, "results database (read only)")->capture_default_str();
  cmd->add_option("--sweep", options->sweep, "sweep name (default: the latest sweep)");
  cmd->add_option("--out", options->out_dir,
                  "report directory (default: reports/<sweep>); an earlier report there is replaced, "
                  "any other non-empty directory is refused");
  cmd->add_option("--gnuplot", options->gnuplot,
                  "gnuplot executable (default: $GNUPLOT, else gnuplot on PATH)");
  return cmd;
}

int run_report(const ReportOptions& options) {
  const std::optional<std::string> gnuplot = find_gnuplot(options.gnuplot);
  store::Database db = open_results(options.db_path);
  const SweepData data = load_sweep(db, options.sweep);
  const fs::path out = out_path(options, data.sweep.name);
  StagedOutputDir staged(out, OutputOwner{"--out", "ulysses-tune report", {options.db_path}});
  const fs::path& temp = staged.staging();

  const std::string command = "ulysses-tune report --db " + shell_quote(options.db_path) +
                              " --sweep " + shell_quote(data.sweep.name) + " --out " +
                              shell_quote(out.string());
  const std::vector<Plot> plots = write_plots(data, temp.string(), gnuplot);
  write_file(temp / "trials.csv", render_csv(trial_fields_table(data.trials)));
  write_file(temp / "README.md", render_readme(data, plots, command));
  staged.commit();

  int drawn = 0;
  for (const Plot& plot : plots) drawn += plot.omitted.empty() ? 1 : 0;
  std::cout << "report: wrote " << (out / "README.md").string() << " (" << data.trials.size()
            << " trials, " << drawn << " of " << plots.size() << " plots drawn)" << std::endl;
  return 0;
}

}  // namespace ulysses::report
