// `ulysses-tune calibrate`: hardware profile -> ulysses-bench ranks -> calibrations table.
#include "tuner/calibrate/calibrate_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "common/error.h"
#include "common/input_file.h"
#include "common/paths.h"
#include "config/run_config.h"
#include "tuner/calibrate/bench_results.h"
#include "tuner/calibrate/hardware_profile.h"
#include "tuner/launch/cli_checks.h"
#include "tuner/launch/free_port.h"
#include "tuner/launch/launch_plan.h"
#include "tuner/launch/supervisor.h"
#include "tuner/store/store.h"
#include "common/remove_tree.h"

namespace fs = std::filesystem;

namespace ulysses::calibrate {
namespace {

std::string host_name() {
  char buffer[256] = {};
  return gethostname(buffer, sizeof(buffer) - 1) == 0 ? std::string(buffer) : "unknown";
}

// A fresh private directory for the run config and the benchmark output.
fs::path make_temp_dir() {
  std::string pattern = (fs::temp_directory_path() / "ulysses-calibrate-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) throw UserError("calibrate: cannot create a temp dir");
  return pattern;
}

std::string join(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) {
    if (!out.empty()) out += ' ';
    out += shell_quote(w);
  }
  return out;
}

}  // namespace

CLI::App* add_calibrate_command(CLI::App& app, CalibrateOptions* options) {
  CLI::App* cmd = app.add_subcommand(
      "calibrate",
      "Measure this machine with ulysses-bench (all-to-all bandwidth, attention, GEMM, MLP, "
      "host<->device copies) and store the results in the database for the cost model");
  cmd->add_option("--hardware", options->hardware_path, "Hardware profile (profiles/hardware/)")
      ->required()
      ->type_name("HW.yaml");
  cmd->add_option("--db", options->db_path, "Results database (SQLite)")
      ->type_name("PATH")
      ->capture_default_str();
  cmd->add_option("--config", options->config_path,
                  "Run config whose model shapes the benchmarks use (default: preset tiny)")
      ->type_name("RUN.yaml");
  cmd->add_option("--set", options->overrides, "Override a run-config key (repeatable)")
      ->type_name("KEY=VALUE");
  cmd->add_option("--nproc", options->nproc,
                  "Ranks of the all-to-all (default: the profile's devices_per_node)")
      ->type_name("N")
      ->check(launch::integer_at_least(1));
  cmd->add_option("--filter", options->filter, "Only benchmarks matching this regex")
      ->type_name("REGEX");
  cmd->add_option("--min-time", options->min_time_s,
                  "Seconds of measurement per benchmark (default 0.05 on cpu, 0.5 on cuda)")
      ->type_name("S")
      ->check(launch::positive_number());
  cmd->add_option("--bench", options->bench,
                  "ulysses-bench executable (default: beside ulysses-tune)")
      ->type_name("PATH");
  cmd->footer(
      "Runs `ulysses-bench --config RUN.yaml --set mesh.sp=N ...` on N local ranks with torchrun\n"
      "variables (as `ulysses-tune launch --trainer ulysses-bench` does), then inserts one row in\n"
      "calibration_runs and one per measured figure in calibrations (metrics time_ms,\n"
      "algbw_GBps, busbw_GBps, tflops, GBps). On CPU profiles a quick set runs in seconds.\n\n"
      "Example:\n"
      "  ulysses-tune calibrate --hardware profiles/hardware/cpu-local.yaml --db results.db");
  return cmd;
}

int run_calibrate(const CalibrateOptions& options) {
  const HardwareProfile hardware = load_hardware_profile(options.hardware_path);
  const int nproc = options.nproc > 0 ? options.nproc : static_cast<int>(hardware.devices_per_node);
  const bool cuda = hardware.device_type == "cuda";
  const fs::path temp = make_temp_dir();
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      ulysses::remove_tree(dir);
    }
  } cleanup{temp};

  std::string config_path = options.config_path;
  std::vector<std::string> overrides;
  if (config_path.empty()) {
    config_path = (temp / "run.yaml").string();
    std::ofstream(config_path) << "model: {preset: tiny}\n";
    if (cuda) overrides.push_back("memory.precision=bf16");
  }
  overrides.push_back("mesh.sp=" + std::to_string(nproc));
  overrides.push_back("mesh.dp=1");
  overrides.push_back("train.device=" + hardware.device_type);
  for (const auto& o : options.overrides) overrides.push_back(o);
  config::RunConfig run_config = config::load_run_config(config_path, overrides);
  config::validate(run_config, nproc);

  const std::string bench = options.bench.empty() ? sibling_binary("ulysses-bench") : options.bench;
  if (access(bench.c_str(), X_OK) != 0) {
    throw UserError("--bench: " + bench +
                    ": not an executable file (build it first: scripts/build.sh ulysses_bench)");
  }
  const fs::path json_path = temp / "bench.json";
  std::vector<std::string> argv = {bench, "--config", config_path};
  for (const auto& o : overrides) {
    argv.push_back("--set");
    argv.push_back(o);
  }
  // No size flags: ulysses-bench's defaults (tuner/bench/default_sizes.h, shown in its --help).
  const double min_time = options.min_time_s > 0 ? options.min_time_s : (cuda ? 0.5 : 0.05);
  argv.push_back("--benchmark_min_time=" + std::to_string(min_time));
  if (!options.filter.empty()) argv.push_back("--benchmark_filter=" + options.filter);
  argv.push_back("--benchmark_out=" + json_path.string());
  argv.push_back("--benchmark_out_format=json");

  launch::LaunchOptions plan;
  plan.nproc = nproc;
  const int port = launch::pick_free_port();
  const std::vector<std::string> base = launch::current_environment();
  std::vector<launch::ProcessSpec> specs;
  for (int local_rank = 0; local_rank < nproc; ++local_rank) {
    launch::ProcessSpec spec;
    spec.argv = argv;
    spec.env =
        launch::merge_environment(base, launch::rank_variables(plan, local_rank, port, base));
    specs.push_back(std::move(spec));
  }
  std::cerr << "calibrate: " << hardware.name << ", " << nproc << " rank(s): " << join(argv)
            << std::endl;
  const launch::SupervisionResult result = launch::supervise(specs, launch::SupervisorOptions{});
  if (result.outcome != launch::Outcome::kAllSucceeded) {
    if (result.first_failure) {
      std::cerr << "calibrate: ulysses-bench rank " << result.first_failure->index << " "
                << launch::describe_exit(*result.first_failure) << std::endl;
    }
    return result.exit_status;
  }

  const std::vector<store::Calibration> rows =
      calibrations_from_bench_json(read_input_file(json_path.string(), "a JSON file"),
                                   "ulysses-bench output");
  if (rows.empty()) {
    throw UserError("--filter: ulysses-bench produced no results (does the filter match?)");
  }
  store::Store db = store::Store::open(options.db_path);
  store::CalibrationRun run;
  run.hardware = hardware.name;
  run.host = host_name();
  run.device = hardware.device_type;
  run.world_size = nproc;
  run.command = join(argv);
  const int64_t run_id = db.add_calibration_run(run, rows);

  for (const auto& row : rows) {
    if (row.metric == "time_ms") continue;
    std::printf("%-60s %-11s %12.5g %s\n", row.benchmark.c_str(), row.metric.c_str(), row.value,
                row.unit.c_str());
  }
  std::printf("calibration run %lld: %zu rows stored in %s\n", static_cast<long long>(run_id),
              rows.size(), options.db_path.c_str());
  return kExitOk;
}

}  // namespace ulysses::calibrate
