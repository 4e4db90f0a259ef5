// `ulysses-tune launch`: options -> validated run config -> printed lines or supervised ranks.
#include "tuner/launch/launch_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "common/error.h"
#include "common/output_dir.h"
#include "common/paths.h"
#include "config/run_config.h"
#include "train/preflight.h"
#include "tuner/launch/cli_checks.h"
#include "tuner/launch/free_port.h"
#include "tuner/launch/supervisor.h"

namespace fs = std::filesystem;

namespace ulysses::launch {
namespace {

constexpr const char* kTrainerName = "ulysses-train";

// Throws UserError "<key> <dir>: ..." when `dir` is, or lies inside, a sweep's directory of trial
// runs: the job would write its metrics, logs or checkpoints over a trial's. Reads only.
void check_not_in_sweep_runs(const std::string& dir, const std::string& key) {
  if (dir.empty()) return;
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(dir), ec);
  if (ec) p = fs::absolute(dir).lexically_normal();
  for (; !p.empty(); p = p.parent_path()) {
    if (is_output_of(p, kSweepRunsWriter)) {
      throw UserError(key + " " + dir + ": is inside " + p.string() +
                      ", a sweep's trial runs, and would write over a trial's files; choose "
                      "another directory (--set " + key + "=DIR)");
    }
    if (p == p.parent_path()) break;
  }
}

// The trainer as an absolute path: a name without '/' is looked up on PATH.
std::string resolve_trainer(const LaunchOptions& options) {
  const std::string requested =
      options.trainer.empty() ? sibling_binary(kTrainerName) : options.trainer;
  if (requested.find('/') != std::string::npos) {
    if (is_executable_file(requested)) return fs::absolute(requested).lexically_normal().string();
  } else if (const std::string found = find_on_path(requested); !found.empty()) {
    return fs::absolute(found).string();
  }
  if (options.trainer.empty()) {
    throw UserError(std::string(kTrainerName) +
                    ": not found beside ulysses-tune, in $ULYSSES_BIN_DIR or on PATH "
                    "(build it, or pass --trainer PATH)");
  }
  throw UserError("--trainer: " + options.trainer + ": not an executable file");
}

// Where rank `rank`'s stderr goes: ranks do not print to the terminal, so that one error is not
// printed once per rank with the collective library's noise around it (see report()).
fs::path rank_log(const fs::path& logs, int rank) {
  return logs / ("rank-" + std::to_string(rank) + ".err");
}

// The line of a rank's stderr that says why it failed: its last "error: " or "out of memory: "
// line (what every main prints last), else its last non-empty line, else "".
std::string failure_line(const fs::path& log) {
  std::ifstream in(log);
  std::string line, last, last_error;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    last = line;
    if (line.rfind("error: ", 0) == 0 || line.rfind("out of memory: ", 0) == 0) last_error = line;
  }
  return last_error.empty() ? last : last_error;
}

std::vector<ProcessSpec> rank_specs(const LaunchOptions& options, const std::string& trainer,
                                    int master_port, const fs::path& logs) {
  const std::vector<std::string> base = current_environment();
  std::vector<std::string> argv{trainer};
  for (auto& arg : trainer_arguments(options)) argv.push_back(std::move(arg));
  std::vector<ProcessSpec> specs;
  for (int local_rank = 0; local_rank < options.nproc; ++local_rank) {
    ProcessSpec spec;
    spec.argv = argv;
    spec.env = merge_environment(base, rank_variables(options, local_rank, master_port, base));
    spec.stderr_path =
        rank_log(logs, effective_node_rank(options) * options.nproc + local_rank).string();
    specs.push_back(std::move(spec));
  }
  return specs;
}

// After the ranks ended: on a failure, the first failing rank's error line once, then which rank
// failed and where every rank's stderr is; on success, this node's first rank's stderr (warnings).
void report(const LaunchOptions& options, const SupervisionResult& result, const fs::path& logs) {
  const int first_rank = effective_node_rank(options) * options.nproc;
  if (result.outcome == Outcome::kFailed) {
    const ProcessExit& failure = *result.first_failure;
    const std::string why = failure_line(rank_log(logs, first_rank + failure.index));
    if (!why.empty()) std::cerr << why << "\n";
    std::cerr << "launch: rank " << first_rank + failure.index << " (local rank " << failure.index
              << ", pid " << failure.pid << ") " << describe_exit(failure) << "; stopped "
              << result.stopped << " other rank(s); every rank's stderr: " << logs.string()
              << std::endl;
  } else if (result.outcome == Outcome::kAllSucceeded) {
    std::ifstream first(rank_log(logs, first_rank));
    std::cerr << first.rdbuf();
    std::cerr.clear();  // an empty log sets failbit
  } else if (result.outcome == Outcome::kInterrupted) {
    std::cerr << "launch: interrupted by signal " << result.interrupt_signal << " ("
              << strsignal(result.interrupt_signal) << "); stopped " << result.stopped
              << " rank(s)" << std::endl;
  }
}

}  // namespace

CLI::App* add_launch_command(CLI::App& app, LaunchOptions* options) {
  CLI::App* launch = app.add_subcommand(
      "launch",
      "Start a training job: NPROC local ranks of ulysses-train, or print the torchrun/srun "
      "command lines for a cluster");
  launch->add_option("RUN.yaml", options->config_path, "Run config of ulysses-train (YAML)")
      ->required()
      ->type_name("PATH");
  launch->add_option("--nproc", options->nproc, "Ranks to start on this node (one per GPU)")
      ->required()
      ->type_name("N")
      ->check(integer_at_least(1));
  launch->add_option("--set", options->overrides,
                     "Override a run-config key, e.g. --set memory.tiled_mlp=4 (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  launch->add_option("--nnodes", options->nnodes, "Nodes in the job")
      ->type_name("M")
      ->check(integer_at_least(1))
      ->capture_default_str();
  launch->add_option("--node-rank", options->node_rank, "This node's rank in [0, M) (default 0)")
      ->type_name("R")
      ->check(integer_at_least(0));
  launch->add_option("--master-addr", options->master_addr, "Address of node 0 (rendezvous)")
      ->type_name("ADDR")
      ->capture_default_str();
  launch->add_option("--master-port", options->master_port,
                     "Rendezvous port on node 0; required when M > 1 (default: a free port)")
      ->type_name("PORT")
      ->check(CLI::Range(1, 65535));
  launch->add_option("--trainer", options->trainer,
                     "Trainer executable (default: ulysses-train beside ulysses-tune)")
      ->type_name("PATH");
  launch->add_option("--print", options->print,
                     "Print the equivalent cluster command line(s) instead of running")
      ->type_name("TOOL")
      ->check(CLI::IsMember({"torchrun", "srun"}));
  launch->footer(
      "Each rank runs `TRAINER --config RUN.yaml [--set KEY=VALUE]...` with RANK, WORLD_SIZE,\n"
      "LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT set as torchrun sets\n"
      "them. The run config is loaded and validated for world size M * N before any rank starts,\n"
      "and (unless --print) its data files, checkpoint.resume and train.device are checked.\n"
      "If a rank fails, the others get SIGTERM (SIGKILL 5 s later) and launch exits with that\n"
      "rank's status (128 + signal for a signal death); SIGINT/SIGTERM are forwarded to all ranks.\n"
      "Each rank's stderr goes to OUTPUT.DIR/logs/rank-<r>.err; launch prints the first failing\n"
      "rank's error line once (and, after a successful run, the first rank's stderr).\n"
      "Exit status 2: bad options or run config.\n\n"
      "Examples:\n"
      "  ulysses-tune launch experiments/runs/tiny-cpu.yaml --nproc 4 --set train.steps=20\n"
      "  ulysses-tune launch run.yaml --nproc 8 --nnodes 2 --master-addr node0 --master-port "
      "29500 --print torchrun");
  return launch;
}

int run_launch(const LaunchOptions& options) {
  check_launch_options(options);
  config::RunConfig run_config = config::load_run_config(options.config_path, options.overrides);
  validate_for_launch(run_config, options);  // a mesh not fitting the world says what to set
  if (options.print == "torchrun" && options.nnodes > 1 && options.master_addr == kLocalMasterAddr) {
    throw UserError("--master-addr: give node 0's address (reachable from every node) for "
                    "--nnodes " + std::to_string(options.nnodes) + "; " + kLocalMasterAddr +
                    " would point each node at itself");
  }
  if (!options.print.empty()) {  // the files and devices are the cluster's: not checked here
    const std::string trainer =
        options.trainer.empty() ? sibling_binary(kTrainerName) : options.trainer;
    for (const auto& line : cluster_command_lines(options, trainer)) std::cout << line << '\n';
    std::cout.flush();
    return kExitOk;
  }
  // Data files, checkpoint to resume, device: one line here rather than one per rank later.
  train::check_run_inputs(run_config);
  check_not_in_sweep_runs(run_config.output.dir, "output.dir");
  check_not_in_sweep_runs(run_config.checkpoint.dir, "checkpoint.dir");
  const std::string trainer = resolve_trainer(options);
  const int master_port = options.master_port > 0 ? options.master_port : pick_free_port();
  const int first_rank = effective_node_rank(options) * options.nproc;
  std::cerr << "launch: starting ranks " << first_rank << ".." << first_rank + options.nproc - 1
            << " of " << world_size(options) << " (" << trainer << ", master "
            << options.master_addr << ":" << master_port << ")" << std::endl;
  SupervisorOptions supervisor_options;
  supervisor_options.grace_s = options.grace_s;
  const fs::path logs = fs::path(run_config.output.dir) / "logs";
  std::error_code ec;
  fs::create_directories(logs, ec);
  if (ec) throw UserError("output.dir: cannot create " + logs.string() + " (" + ec.message() + ")");
  const SupervisionResult result =
      supervise(rank_specs(options, trainer, master_port, logs), supervisor_options);
  report(options, result, logs);
  return result.exit_status;
}

}  // namespace ulysses::launch
