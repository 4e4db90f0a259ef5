// `ulysses-tune profile`: run config -> nsys profile -> nsys export -> kernel split -> store;
// without nsys, the trainer's own timers -> store.
#include "tuner/nsys_profile/profile_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "common/error.h"
#include "common/output_dir.h"
#include "common/paths.h"
#include "config/run_config.h"
#include "tuner/launch/launch_plan.h"
#include "tuner/launch/supervisor.h"
#include "tuner/nsys_profile/nsys_ingest.h"
#include "tuner/store/store.h"

namespace fs = std::filesystem;

namespace ulysses::nsys_profile {
namespace {

// Runs argv to completion with this process's environment; returns its exit status.
int run_command(const std::vector<std::string>& argv) {
  std::cerr << "profile: running";
  for (const auto& word : argv) std::cerr << " " << shell_quote(word);
  std::cerr << std::endl;
  launch::ProcessSpec spec;
  spec.argv = argv;
  spec.env = launch::current_environment();
  const launch::SupervisionResult result = launch::supervise({spec}, launch::SupervisorOptions{});
  if (result.outcome == launch::Outcome::kFailed) {
    std::cerr << "profile: " << fs::path(argv[0]).filename().string() << " "
              << launch::describe_exit(*result.first_failure) << std::endl;
  }
  return result.exit_status;
}

nlohmann::json to_json(const DeviceSplit& d) {
  return {{"device", d.device},
          {"window_ms", d.window_ms},
          {"kernel_ms", d.kernel_ms},
          {"comm_ms", d.comm_ms},
          {"compute_ms", d.compute_ms},
          {"overlap_ms", d.overlap_ms},
          {"exposed_comm_ms", d.exposed_comm_ms()},
          {"comm_kernels", d.comm_kernels},
          {"compute_kernels", d.compute_kernels}};
}

// Without Nsight Systems: the step's split as the trainer's own timers measured it (the run's
// summary.json, docs/outputs.md): the record holds the step time as its window, the exclusive
// compute and communication times, no overlap (every collective blocks the stream that issued
// it, so all communication is exposed), and the phases in its details.
store::ProfileRecord from_trainer_timers(const fs::path& summary_path, std::string* description) {
  std::ifstream in(summary_path);
  if (!in) throw UserError("profile: the run wrote no " + summary_path.string());
  const nlohmann::json summary = nlohmann::json::parse(in);
  const auto number = [&](const char* key) {
    return summary.contains(key) && summary[key].is_number() ? summary[key].get<double>() : 0.0;
  };
  store::ProfileRecord record;
  record.devices = summary.value("world_size", int64_t{1});
  record.steps = summary.value("measured_steps", int64_t{0});
  record.window_ms = number("step_ms_median");
  record.comm_ms = number("comm_ms_median");
  record.compute_ms = number("compute_ms_median");
  record.exposed_comm_ms = number("comm_wait_ms_median");
  const nlohmann::json phases = summary.value("phases_ms_median", nlohmann::json::object());
  record.details = nlohmann::json{{"source", "trainer timers"},
                                  {"phases_ms", phases},
                                  {"offload_ms", number("offload_ms_median")},
                                  {"optimizer_ms", number("optimizer_ms_median")}}
                       .dump();
  std::ostringstream text;
  text << std::fixed << std::setprecision(1);
  text << "step " << record.window_ms << " ms (median of " << record.steps
       << " steps, the trainer's timers): compute " << record.compute_ms << " ms, communication "
       << record.comm_ms << " ms (all exposed), offload " << number("offload_ms_median")
       << " ms, optimizer " << number("optimizer_ms_median") << " ms\n";
  text << "phases (inclusive, ms):";
  for (const auto& [name, ms] : phases.items()) {
    if (ms.is_number()) text << " " << name << " " << ms.get<double>();
  }
  text << "\n";
  *description = text.str();
  return record;
}

}  // namespace

CLI::App* add_profile_command(CLI::App& app, ProfileOptions* options) {
  CLI::App* cmd = app.add_subcommand(
      "profile",
      "Re-run a trial (--trial) or a run config (--config) under Nsight Systems and store its "
      "kernel-time split (NCCL comm vs compute, overlap) in the database");
  cmd->add_option("--db", options->db_path, "Results database (SQLite)")
      ->type_name("PATH")
      ->capture_default_str();
  CLI::Option* trial =
      cmd->add_option("--trial", options->trial_id, "Trial id from a sweep in --db")
          ->type_name("ID");
  CLI::Option* config =
      cmd->add_option("--config", options->config_path,
                      "Profile this run config instead of a stored trial (works before any sweep)")
          ->type_name("RUN.yaml");
  trial->excludes(config);
  config->excludes(trial);
  cmd->add_option("--set", options->overrides, "Override a run-config key (repeatable)")
      ->type_name("KEY=VALUE");
  cmd->add_option("--nproc", options->nproc,
                  "Ranks on this node (via ulysses-tune launch; default: the trial's world size "
                  "with --trial, else 1)")
      ->type_name("N")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--out", options->out_dir,
                  "Directory for profile.nsys-rep, profile.sqlite, run.yaml and the run's output "
                  "(new, empty, or an earlier profile, which is replaced)")
      ->type_name("DIR")
      ->capture_default_str();
  cmd->add_option("--nsys", options->nsys, "nsys executable (default: $NSYS, else nsys on PATH)")
      ->type_name("PATH");
  cmd->footer(
      "One of --trial ID or --config RUN.yaml is required. With Nsight Systems (nsys) it\n"
      "runs\n"
      "  nsys profile -t cuda,nvtx --capture-range=nvtx --nvtx-capture=step@ulysses\n"
      "      --capture-range-end=none -o DIR/profile ulysses-train --config DIR/run.yaml\n"
      "(ulysses-tune launch DIR/run.yaml --nproc N when N > 1), then\n"
      "  nsys export --type sqlite -o DIR/profile.sqlite DIR/profile.nsys-rep\n"
      "and splits kernel time inside the `step` NVTX ranges, after profile.warmup_steps steps,\n"
      "into NCCL (comm) and other kernels (compute), with their overlap and the exposed comm.\n"
      "Without nsys (no --nsys, $NSYS unset, none on PATH) it says so in one line, runs the\n"
      "trainer alone and stores the step's split from the trainer's own timers (compute,\n"
      "communication, offload, optimizer and each phase; no kernel-level overlap).");
  return cmd;
}

std::string find_nsys(const std::string& requested) {
  if (!requested.empty()) return is_executable_file(requested) ? requested : "";
  if (const char* env = std::getenv("NSYS"); env != nullptr && *env != '\0') {
    return is_executable_file(env) ? env : "";
  }
  return find_on_path("nsys");
}

std::vector<std::string> nsys_profile_command(const std::string& nsys, const std::string& out_dir,
                                              const std::vector<std::string>& command) {
  std::vector<std::string> argv = {nsys,
                                   "profile",
                                   "-t",
                                   "cuda,nvtx",
                                   "--capture-range=nvtx",
                                   "--nvtx-capture=step@ulysses",
                                   "--capture-range-end=none",
                                   "--force-overwrite=true",
                                   "-o",
                                   (fs::path(out_dir) / "profile").string()};
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

int run_profile(const ProfileOptions& options) {
  if (options.trial_id < 0 && options.config_path.empty()) {
    throw UserError("profile: give --trial ID or --config RUN.yaml");
  }
  const fs::path out = fs::absolute(options.out_dir);
  const OutputOwner owner{"--out", "ulysses-tune profile", {options.db_path}};
  check_replaceable_output(out, owner);

  // Everything is checked before anything is written; the store is created only for a result.
  std::optional<store::Store> db;
  config::RunConfig run_config;
  if (options.trial_id >= 0) {
    if (!fs::exists(options.db_path)) {
      throw UserError("--db: " + options.db_path +
                      ": no such file (it holds the trials of a sweep)");
    }
    db.emplace(store::Store::open(options.db_path));
    const std::optional<std::string> yaml = db->trial_config_yaml(options.trial_id);
    if (!yaml) {
      throw UserError("--trial: no trial " + std::to_string(options.trial_id) + " in " +
                      options.db_path + " (no sweep stored it; use --config RUN.yaml)");
    }
    run_config = config::parse_run_config_yaml(*yaml, options.overrides);
  } else {
    run_config = config::load_run_config(options.config_path, options.overrides);
  }
  int nproc = options.nproc;  // 0: the trial's world, else 1
  if (nproc == 0) {
    nproc = options.trial_id >= 0 ? static_cast<int>(run_config.mesh.dp * run_config.mesh.sp) : 1;
  }
  run_config.output.dir = (out / "run").string();
  config::validate(run_config, nproc);

  const std::string nsys = find_nsys(options.nsys);
  if (nsys.empty() && !options.nsys.empty()) {
    throw UserError("--nsys: " + options.nsys + ": not an executable file");
  }
  const bool traced = !nsys.empty();
  if (!traced) {
    std::cerr << "profile: nsys: Nsight Systems not found ($NSYS unset, no nsys on PATH); the "
                 "split below is from the trainer's own timers (install nsys or pass --nsys PATH "
                 "for the kernel-level split)"
              << std::endl;
  } else if (run_config.train.device != "cuda") {
    std::cerr << "profile: warning: train.device is " << run_config.train.device
              << "; nsys traces CUDA kernels, so the split will be empty" << std::endl;
  }
  // The run writes into a directory beside --out that replaces it once the profile is ingested.
  StagedOutputDir staged(out, owner);
  const fs::path work = staged.staging();
  const fs::path run_yaml = work / "run.yaml";
  config::RunConfig staged_config = run_config;
  staged_config.output.dir = (work / "run").string();
  std::ofstream(run_yaml) << config::to_yaml(staged_config);

  std::vector<std::string> command;
  if (nproc == 1) {
    command = {sibling_binary("ulysses-train"), "--config", run_yaml.string()};
  } else {
    command = {sibling_binary("ulysses-tune"), "launch", run_yaml.string(), "--nproc",
               std::to_string(nproc)};
  }
  if (!traced) {
    if (int status = run_command(command); status != 0) return status;
    std::string description;
    store::ProfileRecord record = from_trainer_timers(work / "run" / "summary.json", &description);
    std::ofstream(run_yaml, std::ios::trunc) << config::to_yaml(run_config);  // the final paths
    staged.commit();
    if (options.trial_id >= 0) record.trial_id = options.trial_id;
    record.config_path = options.config_path;
    record.config_yaml = config::to_yaml(run_config);
    if (!db) db.emplace(store::Store::open(options.db_path));
    const int64_t id = db->add_profile(record);
    std::cout << description << "profile " << id << " stored in " << options.db_path << std::endl;
    return kExitOk;
  }
  if (int status = run_command(nsys_profile_command(nsys, work.string(), command)); status != 0) {
    return status;
  }
  const fs::path report = out / "profile.nsys-rep";
  const fs::path sqlite = out / "profile.sqlite";
  const fs::path staged_report = work / "profile.nsys-rep";
  const fs::path staged_sqlite = work / "profile.sqlite";
  if (int status = run_command({nsys, "export", "--type", "sqlite", "--force-overwrite", "true",
                                "--output", staged_sqlite.string(), staged_report.string()});
      status != 0) {
    return status;
  }

  IngestOptions ingest;
  ingest.skip_steps = run_config.profile.warmup_steps;
  const KernelSplit split = ingest_nsys_sqlite(staged_sqlite.string(), ingest);
  std::ofstream(run_yaml, std::ios::trunc) << config::to_yaml(run_config);  // the final paths
  staged.commit();

  store::ProfileRecord record;
  if (options.trial_id >= 0) record.trial_id = options.trial_id;
  record.config_path = options.config_path;
  record.config_yaml = config::to_yaml(run_config);
  record.report_path = report.string();
  record.sqlite_path = sqlite.string();
  record.devices = static_cast<int64_t>(split.devices.size());
  record.steps = split.steps;
  record.window_ms = split.total.window_ms;
  record.kernel_ms = split.total.kernel_ms;
  record.comm_ms = split.total.comm_ms;
  record.compute_ms = split.total.compute_ms;
  record.overlap_ms = split.total.overlap_ms;
  record.exposed_comm_ms = split.total.exposed_comm_ms();
  record.comm_kernels = split.total.comm_kernels;
  record.compute_kernels = split.total.compute_kernels;
  nlohmann::json details = nlohmann::json::array();
  for (const DeviceSplit& d : split.devices) details.push_back(to_json(d));
  record.details = details.dump();
  if (!db) db.emplace(store::Store::open(options.db_path));
  const int64_t id = db->add_profile(record);

  std::cout << describe(split) << "profile " << id << " stored in " << options.db_path << std::endl;
  return kExitOk;
}

}  // namespace ulysses::nsys_profile
