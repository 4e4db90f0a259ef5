// Capturing the sweep's environment (see environment.h).
#include "tuner/sweep/environment.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/paths.h"
#include "tuner/calibrate/machine_check.h"
#include "tuner/launch/launch_plan.h"

namespace ulysses::sweep {
namespace {

// What `command` prints, trailing blanks removed, whatever its exit status.
std::string all_output(const std::string& command) {
  std::string out = calibrate::bounded_output(command);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "";
}

}  // namespace

std::optional<double> load_average_1m() {
  std::ifstream in("/proc/loadavg");
  double load = 0.0;
  if (!(in >> load) || load < 0.0) return std::nullopt;
  return load;
}

std::string command_output(const std::string& command) {
  const std::string out = all_output(command);
  return out.substr(0, out.find('\n'));
}

std::string capture_environment(const std::string& trainer) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  nlohmann::ordered_json env;
  env["host"] = host;
  env["cpu"] = cpu_model();
  env["cpu_cores"] = std::thread::hardware_concurrency();
  env["memory_gib"] = calibrate::physical_memory_gib();
  env["gpus"] = all_output(
      "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader");
  env["trainer_version"] = all_output(shell_quote(trainer) + " --version");
  const std::string home = project_home();
  env["git_revision"] =
      home.empty() ? "" : command_output("git -C " + shell_quote(home) + " rev-parse HEAD");
  env["git_dirty"] =
      home.empty() ? false
                   : !all_output("git -C " + shell_quote(home) + " status --porcelain -uno")
                          .empty();
  return env.dump();
}

}  // namespace ulysses::sweep
