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

double memory_gib() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * page / (1 << 30) : 0.0;
}

}  // namespace

std::optional<double> load_average_1m() {
  std::ifstream in("/proc/loadavg");
  double load = 0.0;
  if (!(in >> load) || load < 0.0) return std::nullopt;
  return load;
}

int64_t online_cores() {
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return cores > 0 ? cores : 0;
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
  env["memory_gib"] = memory_gib();
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
