// runner: srun — the step command line, environment, classification and the runner (see
// srun_runner.h).
#include "tuner/trial/srun_runner.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>

#include "comm/dist_env.h"
#include "common/error.h"
#include "common/paths.h"
#include "tuner/launch/free_port.h"
#include "tuner/launch/launch_plan.h"

namespace ulysses::trial {
namespace {

// "0,2-3" -> {0, 2, 3}.
std::vector<int> task_ids(const std::string& list) {
  std::vector<int> ids;
  std::stringstream items(list);
  std::string item;
  while (std::getline(items, item, ',')) {
    const size_t dash = item.find('-');
    const int first = std::atoi(item.substr(0, dash).c_str());
    const int last = dash == std::string::npos ? first : std::atoi(item.substr(dash + 1).c_str());
    for (int id = first; id <= last; ++id) ids.push_back(id);
  }
  return ids;
}

// strsignal's text -> the signal number; 0 when none matches.
int signal_named(const std::string& text) {
  for (int sig = 1; sig < NSIG; ++sig) {
    const char* name = strsignal(sig);
    if (name != nullptr && text.rfind(name, 0) == 0) return sig;
  }
  return 0;
}

std::string last_line_of(const std::string& text) {
  const size_t end = text.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return "";
  const size_t newline = text.rfind('\n', end);
  const size_t begin = newline == std::string::npos ? 0 : newline + 1;
  return text.substr(begin, end + 1 - begin);
}

std::string read_tail(const std::string& path) {
  constexpr std::streamoff kTailBytes = 64 * 1024;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  in.seekg(size > kTailBytes ? size - kTailBytes : 0);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Task t's last non-empty stderr line that is its own (slurmstepd writes its messages into the
// tasks' stderr too), or "".
std::string last_task_line(const std::string& text) {
  std::string last;
  std::stringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t begin = line.find_first_not_of(" \t\r");
    if (begin == std::string::npos || line.compare(begin, 10, "slurmstepd") == 0) continue;
    last = line.substr(begin, line.find_last_not_of(" \t\r") + 1 - begin);
  }
  return last;
}

// Output of `command` (run through /bin/sh), "" when it cannot run.
std::string command_output(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "";
  std::string text;
  char buffer[512];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) text += buffer;
  pclose(pipe);
  return text;
}

std::string srun_sibling(const std::string& srun, const std::string& tool) {
  const size_t slash = srun.rfind('/');
  return slash == std::string::npos ? tool : srun.substr(0, slash + 1) + tool;
}

}  // namespace

int step_time_limit_min(double timeout_s) {
  return timeout_s > 0 ? static_cast<int>(std::ceil(timeout_s / 60.0)) : 0;
}

std::vector<std::string> srun_step_argv(const SrunStep& step) {
  TORCH_CHECK(step.nnodes >= 1 && step.ntasks >= step.nnodes && step.ntasks % step.nnodes == 0,
              "srun_step_argv: ", step.ntasks, " tasks do not spread evenly over ", step.nnodes,
              " nodes");
  TORCH_CHECK(!step.command.empty(), "srun_step_argv: empty command");
  TORCH_CHECK(step.nodelist.empty() || static_cast<int>(step.nodelist.size()) == step.nnodes,
              "srun_step_argv: ", step.nodelist.size(), " nodes listed for a step of ",
              step.nnodes);
  std::vector<std::string> argv{step.srun,
                                "--nodes", std::to_string(step.nnodes),
                                "--ntasks", std::to_string(step.ntasks),
                                "--ntasks-per-node", std::to_string(step.ntasks / step.nnodes),
                                "--kill-on-bad-exit=1", "--quit-on-interrupt"};
  if (!step.nodelist.empty()) {
    std::string nodes;
    for (const std::string& node : step.nodelist) nodes += (nodes.empty() ? "" : ",") + node;
    argv.insert(argv.end(), {"--nodelist", nodes, "--overlap"});
  }
  if (const int minutes = step_time_limit_min(step.timeout_s); minutes > 0) {
    argv.insert(argv.end(), {"--time", std::to_string(minutes)});
  }
  argv.insert(argv.end(), {"--job-name", step.job_name,
                           "--output", step.run_dir + "/rank-%t.out",
                           "--error", step.run_dir + "/rank-%t.err"});
  argv.insert(argv.end(), step.command.begin(), step.command.end());
  return argv;
}

std::vector<std::string> srun_environment(std::vector<std::string> base,
                                          const std::string& master_addr, int master_port,
                                          int tasks_per_node) {
  static const char* const kTorchrunVariables[] = {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=",
                                                   "LOCAL_WORLD_SIZE=", "GROUP_RANK=",
                                                   "TORCHELASTIC_"};
  std::vector<std::string> env;
  bool has_omp = false;
  for (std::string& entry : base) {
    bool drop = false;
    for (const char* prefix : kTorchrunVariables) drop = drop || entry.rfind(prefix, 0) == 0;
    has_omp = has_omp || entry.rfind("OMP_NUM_THREADS=", 0) == 0;
    if (!drop) env.push_back(std::move(entry));
  }
  std::vector<std::pair<std::string, std::string>> set{{"MASTER_ADDR", master_addr},
                                                       {"MASTER_PORT", std::to_string(master_port)}};
  if (tasks_per_node > 1 && !has_omp) set.emplace_back("OMP_NUM_THREADS", "1");
  return launch::merge_environment(std::move(env), set);
}

std::string first_host(const std::string& variable, const std::string& node_list) {
  const comm::DistEnv env = comm::detect_dist_env(comm::env_from_map(
      {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_NODELIST", node_list}}));
  if (env.master_addr.empty()) throw UserError(variable + ": '" + node_list + "' names no host");
  return env.master_addr;
}

std::vector<launch::ProcessExit> parse_srun_task_exits(const std::string& srun_stderr,
                                                       int ntasks, bool step_cancelled, int pid) {
  static const std::regex kTaskLine(R"(srun: error: [^:]+: tasks? ([0-9,\-]+): (.*))");
  std::vector<launch::ProcessExit> exits(ntasks);
  for (int t = 0; t < ntasks; ++t) exits[t].index = t, exits[t].pid = pid;
  bool named = false, own_code = false;
  // srun reports a task that failed by itself before it terminates the step (kill-on-bad-exit:
  // "_step_signal: Terminating", then slurmstepd's "CANCELLED AT"); tasks reported after that
  // point were stopped by SLURM, for a peer's failure or for a scancel.
  bool terminating = false;
  std::vector<bool> after_termination(ntasks, false);
  std::stringstream lines(srun_stderr);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.find("_step_signal: Terminating") != std::string::npos ||
        line.find(" CANCELLED AT ") != std::string::npos) {
      terminating = true;
      continue;
    }
    std::smatch m;
    if (!std::regex_search(line, m, kTaskLine)) continue;
    const std::string what = m[2].str();
    int status = 1, sig = 0;
    if (what.rfind("Exited with exit code ", 0) == 0) {
      status = std::atoi(what.c_str() + std::strlen("Exited with exit code "));
      if (status > 128) sig = status - 128;
    } else if ((sig = signal_named(what)) != 0) {
      status = 128 + sig;
    }
    own_code = own_code || (sig == 0 && status != 0);
    for (int t : task_ids(m[1].str())) {
      if (t < 0 || t >= ntasks) continue;
      exits[t].status = status;
      exits[t].signal = sig;
      after_termination[t] = terminating;
      named = true;
    }
  }
  if (!named) return {};
  for (auto& exit : exits) {
    exit.signalled_by_us = exit.signal != 0 && (after_termination[exit.index] ||
                                                ((own_code || step_cancelled) && !terminating));
  }
  return exits;
}

std::string node_failure_line(const std::string& messages, bool backstop_timed_out,
                              double backstop_s) {
  static const char* const kMarks[] = {"DUE TO NODE FAILURE", "Node failure", "node failure",
                                       "NODE_FAIL", "NODE FAIL"};
  std::stringstream lines(messages);
  std::string line;
  while (std::getline(lines, line)) {
    for (const char* mark : kMarks) {
      if (line.find(mark) != std::string::npos) return last_line_of(line);
    }
    if (line.find("Task launch for") != std::string::npos &&
        line.find("failed on node") != std::string::npos) {
      return last_line_of(line);
    }
  }
  if (backstop_timed_out) {
    return "srun did not end " + std::to_string(static_cast<int>(backstop_s)) +
           " s after the step started, past its time limit (a node or slurmctld not answering)";
  }
  return "";
}

StepEnd step_end(const std::string& text) {
  if (text.find("DUE TO TIME LIMIT") != std::string::npos) return StepEnd::kTimeLimit;
  if (text.find(" CANCELLED AT ") != std::string::npos) return StepEnd::kCancelled;
  return StepEnd::kNormal;
}

Classification classify_step(const launch::SupervisionResult& srun, const std::string& srun_stderr,
                             StepEnd end, bool summary_readable,
                             const std::vector<std::string>& last_stderr_lines, double timeout_s,
                             int ntasks) {
  if (srun.outcome != launch::Outcome::kFailed) {
    return classify(srun, summary_readable, last_stderr_lines, timeout_s);
  }
  if (end == StepEnd::kTimeLimit) {
    Classification c;
    c.status = "timeout";
    c.exit_code = launch::kExitTimedOut;
    c.error = "step time limit of " + std::to_string(step_time_limit_min(timeout_s)) +
              " min reached (SLURM)";
    for (const auto& line : last_stderr_lines) {
      if (line.empty() || line.find("DUE TO TIME LIMIT") != std::string::npos) continue;
      c.error += "; " + line;
      break;
    }
    return c;
  }
  const int pid = srun.first_failure ? std::max(1, static_cast<int>(srun.first_failure->pid)) : 1;
  std::vector<launch::ProcessExit> tasks =
      parse_srun_task_exits(srun_stderr, ntasks, end == StepEnd::kCancelled, pid);
  const launch::ProcessExit* first = nullptr;
  for (const auto& exit : tasks) {  // the first task failing on its own, else the first failing
    if (exit.status != 0 && !exit.signalled_by_us) {
      first = &exit;
      break;
    }
  }
  if (first == nullptr && end == StepEnd::kCancelled) {
    Classification c;
    c.status = "running";
    c.error = "step cancelled from outside (scancel)";
    return c;
  }
  if (first == nullptr) {
    for (const auto& exit : tasks) {
      if (exit.status != 0) {
        first = &exit;
        break;
      }
    }
  }
  if (first != nullptr) {
    launch::SupervisionResult per_task;
    per_task.outcome = launch::Outcome::kFailed;
    per_task.exit_status = first->status;
    per_task.first_failure = *first;
    per_task.exits = tasks;
    return classify(per_task, summary_readable, last_stderr_lines, timeout_s);
  }
  // srun failed without naming a task (it could not start the step, or was killed itself).
  Classification c = classify(srun, summary_readable, {last_line_of(srun_stderr)}, timeout_s);
  c.rank = -1;
  return c;
}

SrunRunner::SrunRunner() {
  srun_ = find_on_path("srun");
  if (srun_.empty()) throw UserError("runner: srun: srun is not on PATH (SLURM's client tools)");
  const char* job = std::getenv("SLURM_JOB_ID");
  if (job == nullptr || *job == '\0') {
    throw UserError(
        "runner: srun: not inside a SLURM allocation (SLURM_JOB_ID unset); run the sweep in "
        "salloc / sbatch, or submit it with `ulysses-tune sweep ... --submit`");
  }
  job_id_ = job;
  const char* nodes = std::getenv("SLURM_JOB_NODELIST");
  master_addr_ = nodes != nullptr && *nodes != '\0' ? first_host("SLURM_JOB_NODELIST", nodes)
                                                    : std::string("127.0.0.1");
}

void SrunRunner::cancel_leftover_step(const std::string& job_name) const {
  const std::string squeue = srun_sibling(srun_, "squeue");
  const std::string scancel = srun_sibling(srun_, "scancel");
  std::stringstream steps(command_output(
      shell_quote(squeue) + " --steps --noheader --format='%i %j' --jobs=" +
      shell_quote(job_id_) + " 2>/dev/null"));
  std::string id, name;
  while (steps >> id >> name) {
    if (name != job_name) continue;
    command_output(shell_quote(scancel) + " --quiet " + shell_quote(id) +
                   " 2>/dev/null");
  }
}

TrialOutcome SrunRunner::run(const TrialSpec& spec) {
  TORCH_CHECK(spec.nproc >= 1 && spec.nnodes >= 1 && spec.nproc % spec.nnodes == 0,
              "SrunRunner: ", spec.nproc, " ranks do not spread evenly over ", spec.nnodes,
              " nodes");
  TORCH_CHECK(!spec.run_dir.empty() && !spec.output_dir.empty() && !spec.trainer.empty(),
              "SrunRunner: run_dir, output_dir and trainer must be set");
  prepare_run_dir(spec);
  SrunStep step;
  step.srun = srun_;
  step.nnodes = spec.nnodes;
  step.ntasks = spec.nproc;
  step.timeout_s = spec.timeout_s;
  step.job_name = spec.name.empty() ? "ulysses-trial" : spec.name;
  step.run_dir = spec.run_dir;
  step.command = trainer_argv(spec);
  step.nodelist = spec.nodelist;

  std::vector<std::pair<std::string, std::string>> extra;
  for (const auto& entry : spec.extra_env) {
    const size_t eq = entry.find('=');
    TORCH_CHECK(eq != std::string::npos && eq > 0, "SrunRunner: extra_env entry '", entry,
                "' is not KEY=VALUE");
    extra.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
  }
  launch::ProcessSpec process;
  process.argv = srun_step_argv(step);
  process.env = srun_environment(
      launch::merge_environment(launch::current_environment(), extra),
      spec.nodelist.empty() ? master_addr_ : spec.nodelist.front(), launch::pick_free_port(),
      spec.nproc / spec.nnodes);
  process.stdout_path = spec.run_dir + "/srun.out";
  process.stderr_path = spec.run_dir + "/srun.err";
  launch::SupervisorOptions options;
  options.grace_s = spec.grace_s;
  options.timeout_s =
      step_time_limit_min(spec.timeout_s) > 0
          ? step_time_limit_min(spec.timeout_s) * 60.0 + kSlurmLimitSlackS
          : 0.0;

  const auto start = std::chrono::steady_clock::now();
  const launch::SupervisionResult result = launch::supervise({process}, options);
  TrialOutcome outcome;
  outcome.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (result.outcome != launch::Outcome::kAllSucceeded &&
      result.outcome != launch::Outcome::kFailed) {
    cancel_leftover_step(step.job_name);
  }

  const std::string srun_stderr = read_tail(process.stderr_path);
  std::string messages = srun_stderr;
  std::vector<std::string> last_lines;
  for (int rank = 0; rank < spec.nproc; ++rank) {
    const std::string task_stderr = read_tail(rank_log(spec, rank, "err"));
    messages += task_stderr;
    last_lines.push_back(last_task_line(task_stderr));
  }
  Measurements m = read_measurements(spec.output_dir);
  Classification c = classify_step(result, srun_stderr, step_end(messages), m.summary_found,
                                   last_lines, spec.timeout_s, spec.nproc);
  if (result.outcome == launch::Outcome::kTimedOut) {  // our backstop, not SLURM's limit
    c.error = "timed out after " + std::to_string(static_cast<int>(options.timeout_s)) +
              " s (SLURM did not end the step at its time limit of " +
              std::to_string(step_time_limit_min(spec.timeout_s)) + " min)";
  }
  outcome.interrupt_signal = result.interrupt_signal;
  if (c.status == "running" && outcome.interrupt_signal == 0) outcome.interrupt_signal = SIGTERM;
  fill_outcome(std::move(c), std::move(m), &outcome);
  outcome.node_failure = node_failure_line(
      messages, result.outcome == launch::Outcome::kTimedOut, options.timeout_s);
  return outcome;
}

}  // namespace ulysses::trial
