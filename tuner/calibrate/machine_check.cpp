// A hardware profile against the machine (see machine_check.h).
#include "tuner/calibrate/machine_check.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "common/error.h"

namespace ulysses::calibrate {
namespace {

constexpr double kMiBPerGiB = 1024.0;
constexpr double kReserveEstimateGib = 1.0;  // the driver's reserve where nvidia-smi omits it

std::string gib(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", value);
  return text;
}

// The positive number in environment variable `name`, or 0 when it is unset or empty.
double env_number(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(value > 0)) {
    throw UserError(std::string(name) + ": expected a positive number, got '" + text + "'");
  }
  return value;
}

// The lines `command` prints, or "" when it fails.
std::string output_of(const std::string& command) {
  int status = -1;
  std::string out = bounded_output(command, &status);
  return status == 0 ? out : "";
}

// The smallest GPU's memory as CUDA reports it (GiB), 0 when no GPU answers.
double nvidia_smi_memory_gib() {
  bool with_reserve = true;
  std::string text = output_of(
      "nvidia-smi --query-gpu=memory.total,memory.reserved --format=csv,noheader,nounits");
  if (text.empty()) {
    with_reserve = false;
    text = output_of("nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits");
  }
  double smallest = 0;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    double total_mib = 0, reserved_mib = 0;
    const int read = std::sscanf(line.c_str(), "%lf , %lf", &total_mib, &reserved_mib);
    if (read < 1 || !(total_mib > 0)) continue;
    const double usable = with_reserve && read == 2
                              ? (total_mib - reserved_mib) / kMiBPerGiB
                              : total_mib / kMiBPerGiB - kReserveEstimateGib;
    smallest = smallest == 0 ? usable : std::min(smallest, usable);
  }
  return smallest;
}

bool above(double profile, double machine) {
  return machine > 0 && profile > machine * (1 + kProfileTolerance);
}

}  // namespace

double physical_memory_gib() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * page / (1 << 30) : 0.0;
}

int64_t online_cores() { return std::max(0L, sysconf(_SC_NPROCESSORS_ONLN)); }

std::string bounded_output(const std::string& command, int* exit_status) {
  std::string out;
  if (exit_status) *exit_status = -1;
  FILE* pipe = popen(("timeout 20 " + command + " </dev/null 2>/dev/null").c_str(), "r");
  if (!pipe) return out;
  char buffer[512];
  while (fgets(buffer, sizeof buffer, pipe)) out += buffer;
  const int status = pclose(pipe);
  if (exit_status) *exit_status = status;
  return out;
}

MachineCapacity query_machine(const std::string& device_type) {
  MachineCapacity m;
  m.host_memory_gib = env_number("ULYSSES_HOST_MEMORY_GIB");
  if (m.host_memory_gib == 0) m.host_memory_gib = physical_memory_gib();
  m.host_cores = static_cast<int64_t>(env_number("ULYSSES_HOST_CORES"));
  if (m.host_cores == 0) m.host_cores = online_cores();
  m.device = device_type == "cuda" ? "cuda:0" : "the host";
  m.device_memory_gib = env_number("ULYSSES_DEVICE_MEMORY_GIB");
  if (m.device_memory_gib > 0) {
    m.device_source = "ULYSSES_DEVICE_MEMORY_GIB";
  } else if (device_type == "cuda") {
    m.device_memory_gib = nvidia_smi_memory_gib();
    m.device_source = "nvidia-smi";
  } else {
    m.device_memory_gib = m.host_memory_gib;
    m.device_source = "physical memory";
  }
  return m;
}

double checked_memory_limit_gib(const HardwareProfile& profile, const std::string& profile_path,
                                const MachineCapacity& machine, double limit_gib,
                                bool limit_given) {
  const double device = machine.device_memory_gib;
  if (device <= 0) return limit_gib;
  const std::string has =
      " is more than " + machine.device + " has (" + gib(device) + ", " + machine.device_source +
      ")";
  if (limit_given) {
    if (limit_gib > device) {
      throw UserError("memory_limit_gib: " + gib(limit_gib) + has + "; set it to at most " +
                      gib(device));
    }
    return limit_gib;
  }
  if (above(profile.device_memory_gib, device)) {
    throw UserError("hardware: " + profile_path + ": device.memory_gib: " +
                    gib(profile.device_memory_gib) + has +
                    "; correct the profile or set memory_limit_gib <= " + gib(device) +
                    " in the experiment");
  }
  return std::min(limit_gib, device);
}

void check_offload_host(const HardwareProfile& profile, const std::string& profile_path,
                        const MachineCapacity& machine, bool offload) {
  // No device visible: this is not the machine the trials run on (a dry run elsewhere).
  if (!offload || machine.device_memory_gib <= 0) return;
  if (above(profile.host_memory_gib, machine.host_memory_gib)) {
    throw UserError("hardware: " + profile_path + ": host_memory_gib: " +
                    gib(profile.host_memory_gib) + " is more than this host has (" +
                    gib(machine.host_memory_gib) +
                    "), and the experiment's trials offload to it; correct the profile");
  }
  if (machine.host_cores > 0 && profile.host_cores > machine.host_cores) {
    throw UserError("hardware: " + profile_path + ": host_cores: " +
                    std::to_string(profile.host_cores) + " is more than this host has (" +
                    std::to_string(machine.host_cores) +
                    "), and the experiment's trials offload to it; correct the profile");
  }
}

}  // namespace ulysses::calibrate
