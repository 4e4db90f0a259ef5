// `ulysses-tune calibrate`: runs ulysses-bench on the ranks a hardware profile describes (a
// quick set on CPU), and stores the measured bandwidths and throughputs in the results
// database's `calibrations` table, for the cost model.
#pragma once
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace ulysses::calibrate {

// The options of `ulysses-tune calibrate` (CLI names in the comments).
struct CalibrateOptions {
  std::string hardware_path;           // --hardware profiles/hardware/X.yaml (required)
  std::string db_path = "results.db";  // --db
  std::string config_path;             // --config RUN.yaml: model shapes; "" = preset tiny
  std::vector<std::string> overrides;  // --set KEY=VALUE
  int nproc = 0;                       // --nproc; 0 = the profile's devices_per_node
  std::string filter;                  // --filter REGEX (Google Benchmark filter); "" = all
  double min_time_s = 0.0;             // --min-time; 0 = 0.05 s on cpu, 0.5 s on cuda
  std::string bench;                   // --bench PATH; "" = ulysses-bench beside ulysses-tune
};

// Adds the subcommand; parsing writes into *options, which must outlive the parse.
CLI::App* add_calibrate_command(CLI::App& app, CalibrateOptions* options);

// Validates the profile and the run config (sp = nproc, dp = 1, train.device from the profile)
// before starting anything, runs ulysses-bench on nproc local ranks (as `ulysses-tune launch`
// would), parses its JSON and inserts one calibration run with its rows in one transaction.
// Prints the rows and returns 0; returns the failing rank's status when ulysses-bench fails.
// Throws UserError for a bad profile, run config, benchmark binary or database, or when the
// benchmarks produced no result (e.g. a filter that matches nothing).
int run_calibrate(const CalibrateOptions& options);

}  // namespace ulysses::calibrate
