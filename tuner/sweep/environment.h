// The environment a sweep ran in: host, CPU, devices, driver, LibTorch and NCCL
// versions, the trainer's --version, the git revision of the source tree. Stored per sweep.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace ulysses::sweep {

// A JSON object text: host, cpu, cpu_cores, memory_gib, gpus (nvidia-smi's name/driver/memory
// when it exists), trainer_version (`<trainer> --version`), git_revision (of project_home(), ""
// outside a git checkout), ulysses_tune build info. Never throws: missing pieces are "".
std::string capture_environment(const std::string& trainer);

// The machine's 1-minute load average now (the first field of /proc/loadavg); nullopt where it
// cannot be read (not Linux).
std::optional<double> load_average_1m();

// The first line printed by a command run through /bin/sh (stderr discarded), "" on failure.
std::string command_output(const std::string& command);

}  // namespace ulysses::sweep
