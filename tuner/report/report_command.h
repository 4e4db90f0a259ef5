// `ulysses-tune report`: turns one sweep of the results database into a report directory that
// people read: README.md with tables and plots, trials.csv, the PNGs and the
// gnuplot script and data that drew them.
#pragma once
#include <string>

namespace CLI {
class App;
}

namespace ulysses::report {

// The options of `ulysses-tune report` (CLI names in the comments).
struct ReportOptions {
  std::string db_path = "results.db";  // --db
  std::string sweep;                   // --sweep NAME; "" = the latest sweep
  std::string out_dir;                 // --out DIR; "" = reports/<sweep name>
  std::string gnuplot;                 // --gnuplot PATH; "" = $GNUPLOT, else gnuplot on PATH
};

// Adds the subcommand; parsing writes into *options, which must outlive the parse.
CLI::App* add_report_command(CLI::App& app, ReportOptions* options);

// Reads the sweep (read-only; the database is never created or changed) and writes the report
// into a temporary directory beside --out, then renames it to --out, replacing an earlier report
// there. Prints the README's path and returns 0.
// Throws UserError naming the thing, before anything is written, for a missing or corrupt
// database, an unknown sweep, a database without sweeps, an unusable --gnuplot, or an --out that
// exists and is neither empty nor a report (no README.md); std::runtime_error when gnuplot fails.
// On every error no report directory is left behind (an earlier one at --out stays as it was).
// Without gnuplot the report is written and says how to draw the plots.
int run_report(const ReportOptions& options);

}  // namespace ulysses::report
