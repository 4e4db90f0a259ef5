// Runs one trial's ranks under the supervisor and turns the result into a TrialOutcome (see
// trial_runner.h).
#include "tuner/trial/trial_runner.h"

#include <c10/util/Exception.h>

#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "tuner/launch/free_port.h"
#include "tuner/launch/launch_plan.h"
#include "tuner/launch/supervisor.h"
#include "tuner/trial/classify.h"
#include "tuner/trial/measurements.h"

namespace fs = std::filesystem;

namespace ulysses::trial {

// Seconds the other ranks get to end by themselves after a rank's communication failure.
constexpr double kCommFailureSettleS = 10.0;

std::string rank_log(const TrialSpec& spec, int rank, const char* stream) {
  return spec.run_dir + "/rank-" + std::to_string(rank) + "." + stream;
}

std::vector<std::string> trainer_argv(const TrialSpec& spec) {
  std::vector<std::string> argv{spec.trainer};
  if (spec.trainer_args.empty()) {
    argv.insert(argv.end(), {"--config", spec.run_dir + "/run.yaml"});
  } else {
    argv.insert(argv.end(), spec.trainer_args.begin(), spec.trainer_args.end());
  }
  return argv;
}

void prepare_run_dir(const TrialSpec& spec) {
  std::error_code ec;
  fs::create_directories(spec.run_dir, ec);
  if (ec) throw UserError("run_dir: cannot create " + spec.run_dir + ": " + ec.message());
  const std::string config_path = spec.run_dir + "/run.yaml";
  {
    std::ofstream out(config_path, std::ios::trunc);
    out << spec.config_yaml;
    if (!out) throw UserError("run_dir: cannot write " + config_path);
  }
  fs::remove(spec.output_dir + "/summary.json", ec);
  fs::remove(spec.output_dir + "/metrics.jsonl", ec);
}

namespace {

// One process per rank: the trainer with torchrun's variables, logs in run_dir.
std::vector<launch::ProcessSpec> rank_specs(const TrialSpec& spec) {
  std::vector<std::pair<std::string, std::string>> extra;
  for (const auto& entry : spec.extra_env) {
    const size_t eq = entry.find('=');
    TORCH_CHECK(eq != std::string::npos && eq > 0, "run_trial: extra_env entry '", entry,
                "' is not KEY=VALUE");
    extra.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
  }
  const std::vector<std::string> base =
      launch::merge_environment(launch::current_environment(), extra);
  launch::LaunchOptions plan;
  plan.config_path = spec.run_dir + "/run.yaml";
  plan.nproc = spec.nproc;
  const int port = launch::pick_free_port();
  const std::vector<std::string> argv = trainer_argv(spec);
  std::vector<launch::ProcessSpec> specs;
  for (int rank = 0; rank < spec.nproc; ++rank) {
    launch::ProcessSpec process;
    process.argv = argv;
    process.env = launch::merge_environment(base, launch::rank_variables(plan, rank, port, base));
    process.stdout_path = rank_log(spec, rank, "out");
    process.stderr_path = rank_log(spec, rank, "err");
    specs.push_back(std::move(process));
  }
  return specs;
}

// Sets the calling thread's CPU affinity to `cpus` for its lifetime (children forked meanwhile
// inherit it) and restores the one it had. Empty: changes nothing.
class ThreadAffinity {
 public:
  explicit ThreadAffinity(const std::vector<int>& cpus) {
    if (cpus.empty()) return;
    TORCH_CHECK(pthread_getaffinity_np(pthread_self(), sizeof previous_, &previous_) == 0,
                "run_trial: cannot read the thread's CPU affinity");
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu : cpus) {
      TORCH_CHECK(cpu >= 0 && cpu < CPU_SETSIZE, "run_trial: cpu ", cpu, " out of range");
      CPU_SET(cpu, &set);
    }
    TORCH_CHECK(pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0,
                "run_trial: cannot pin the ranks to their cpus");
    set_ = true;
  }
  ~ThreadAffinity() {
    if (set_) pthread_setaffinity_np(pthread_self(), sizeof previous_, &previous_);
  }
  ThreadAffinity(const ThreadAffinity&) = delete;
  ThreadAffinity& operator=(const ThreadAffinity&) = delete;

 private:
  cpu_set_t previous_{};
  bool set_ = false;
};

}  // namespace

TrialOutcome run_trial(const TrialSpec& spec) {
  TORCH_CHECK(spec.nproc >= 1, "run_trial: nproc must be >= 1, got ", spec.nproc);
  TORCH_CHECK(!spec.run_dir.empty() && !spec.output_dir.empty() && !spec.trainer.empty(),
              "run_trial: run_dir, output_dir and trainer must be set");
  TORCH_CHECK(spec.timeout_s >= 0 && spec.grace_s >= 0, "run_trial: negative timeout or grace");
  prepare_run_dir(spec);
  const std::vector<launch::ProcessSpec> processes = rank_specs(spec);
  launch::SupervisorOptions options;
  options.grace_s = spec.grace_s;
  options.timeout_s = spec.timeout_s;
  // A rank that fails exits at once, before tearing its process groups down
  // (comm::run_rank_or_exit), so a peer that loses its connection to it fails after it: its own
  // status (12 for out of memory) is already there when the peers' 13 arrives, whatever order
  // the supervisor reaps them in, and classify() picks it by exit status. The window covers a
  // rank started by something else (the deepspeed backend's Python ranks) that still tears down
  // before it exits.
  options.settle_s = kCommFailureSettleS;

  const auto start = std::chrono::steady_clock::now();
  launch::SupervisionResult result;
  {
    const ThreadAffinity pinned(spec.cpus);
    result = launch::supervise(processes, options);
  }
  TrialOutcome outcome;
  outcome.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::vector<std::string> last_lines;
  for (int rank = 0; rank < spec.nproc; ++rank) {
    last_lines.push_back(last_nonempty_line(rank_log(spec, rank, "err")));
  }
  Measurements m = read_measurements(spec.output_dir);
  Classification c = classify(result, m.summary_found, last_lines, spec.timeout_s);
  outcome.interrupt_signal = result.interrupt_signal;
  fill_outcome(std::move(c), std::move(m), &outcome);
  return outcome;
}

void fill_outcome(Classification c, Measurements m, TrialOutcome* out) {
  TrialOutcome& outcome = *out;
  outcome.status = std::move(c.status);
  outcome.exit_code = c.exit_code;
  outcome.error = std::move(c.error);
  if (!m.error.empty()) outcome.error += (outcome.error.empty() ? "" : "; ") + m.error;
  outcome.failed_rank = c.rank;
  outcome.step_ms = m.step_ms;
  outcome.tokens_per_s = m.tokens_per_s;
  outcome.tokens_per_s_per_rank = m.tokens_per_s_per_rank;
  outcome.final_loss = m.final_loss;
  outcome.peak_mem_bytes = m.peak_mem_bytes;
  outcome.peak_host_bytes = m.peak_host_bytes;
  outcome.summary_json = std::move(m.summary_json);
  outcome.steps = std::move(m.steps);
  outcome.phases = std::move(m.phases);
}

void apply_outcome(const TrialOutcome& outcome, store::TrialRecord* record) {
  record->status = outcome.status;
  record->exit_code = outcome.exit_code;
  record->error = outcome.error;
  record->wall_s = outcome.wall_s;
  record->step_ms = outcome.step_ms;
  record->tokens_per_s = outcome.tokens_per_s;
  record->tokens_per_s_per_rank = outcome.tokens_per_s_per_rank;
  record->peak_mem_bytes = outcome.peak_mem_bytes;
  record->peak_host_bytes = outcome.peak_host_bytes;
  record->final_loss = outcome.final_loss;
  record->summary = outcome.summary_json;
}

}  // namespace ulysses::trial
