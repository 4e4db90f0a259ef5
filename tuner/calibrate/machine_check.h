// A hardware profile against the machine a command runs on: what the device and the host really
// have (device memory as CUDA reports it, host memory, cores), and the check that a sweep never
// starts trials under a limit the device does not have.
#pragma once
#include <cstdint>
#include <string>

#include "tuner/calibrate/hardware_profile.h"

namespace ulysses::calibrate {

// What this machine has. A figure of 0 is unknown (nothing visible to ask): no check uses it.
struct MachineCapacity {
  std::string device;            // how messages name it: "cuda:0" or "the host"
  std::string device_source;     // where device_memory_gib came from, for messages
  double device_memory_gib = 0;  // per device: the smallest GPU's total as CUDA reports it (the
                                 // driver's reserve taken off), or the host's memory on cpu
  double host_memory_gib = 0;    // physical memory of this node
  int64_t host_cores = 0;        // online cores of this node
};

// Asks the machine. On cuda: `nvidia-smi --query-gpu=memory.total,memory.reserved` over every GPU
// it lists (total less the driver's reserve is what CUDA reports; where the driver does not give
// the reserve, 1 GiB is taken off as an estimate); no nvidia-smi or no GPU: device memory 0. On
// cpu the device is the host. The environment overrides what the machine reports (for tests, and
// for a node whose tools cannot see its devices): ULYSSES_DEVICE_MEMORY_GIB,
// ULYSSES_HOST_MEMORY_GIB, ULYSSES_HOST_CORES. Throws UserError naming the variable when one is
// set to something that is not a positive number.
MachineCapacity query_machine(const std::string& device_type);

// This node's physical memory (GiB) and online CPU cores as the OS reports them, without the
// environment's overrides; 0 when unknown.
double physical_memory_gib();
int64_t online_cores();

// What shell `command` prints on stdout, with no input, stderr dropped and at most 20 s to run
// (a tool that waits must not stall the caller); "" when it cannot start. *exit_status, when
// given, gets pclose's status (0: it ran and exited 0).
std::string bounded_output(const std::string& command, int* exit_status = nullptr);

// How far a profile's figure may exceed the machine's before it is refused: rounding in a
// profile (1 %). Within it the machine's figure is used.
inline constexpr double kProfileTolerance = 0.01;

// The per-rank memory limit trials run under, checked against the machine:
//   - limit_given (the experiment wrote memory_limit_gib = limit_gib): limit_gib, refused when it
//     is more than the device has;
//   - otherwise min(profile's device.memory_gib, device memory); a profile more than
//     kProfileTolerance above the device is refused.
// Unknown device memory (0): limit_gib as given. Throws UserError in one line naming the profile
// file and key, both figures and what to do, e.g. "hardware: profiles/hardware/h200.yaml:
// device.memory_gib: 150.00 GiB is more than cuda:0 has (139.80 GiB, nvidia-smi); correct the
// profile or set memory_limit_gib <= 139.80 in the experiment".
double checked_memory_limit_gib(const HardwareProfile& profile, const std::string& profile_path,
                                const MachineCapacity& machine, double limit_gib,
                                bool limit_given);

// Where trials offload to the host from a GPU (offload true): the profile's
// host_memory_gib and host_cores must not exceed this node's (beyond kProfileTolerance for memory;
// host_cores 0 = not given). Throws UserError in one line naming the profile file and key and both
// figures. Unknown machine figures are not checked, nor anything where the device memory is
// unknown (no device visible: not the machine the trials run on).
void check_offload_host(const HardwareProfile& profile, const std::string& profile_path,
                        const MachineCapacity& machine, bool offload);

}  // namespace ulysses::calibrate
