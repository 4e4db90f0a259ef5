// Hardware profiles (profiles/hardware/<name>.yaml): what a cluster offers per device and per
// link, for calibration, MFU (peak FLOP/s) and the cost model's predictions for clusters not at
// hand. Figures are vendor peaks unless a comment in the file says otherwise;
// `ulysses-tune calibrate` measures the achievable ones.
//
//   name: h100-sxm                     # defaults to the file stem
//   description: one line
//   device: {type: cuda, name: NVIDIA H100 80GB HBM3, memory_gib: 80}
//   nodes: 1
//   devices_per_node: 1                # ranks per node (CPU profiles: processes)
//   host_memory_gib: 2048
//   host_cores: 112                    # per node; optional (0 = not given)
//   host_memory_GBps: 563.2            # per node: the host memory's peak bandwidth (channels x
//                                      # MT/s x 8 B), shared by the node's ranks; optional (0 =
//                                      # not given: kDefaultHostMemoryGBps)
//   peak_tflops: {bf16: 989.4, fp32: 66.9}  # dense, per device
//   links:                             # GB/s per device and direction
//     {intra_node_GBps: 450, inter_node_GBps: 50, host_to_device_GBps: 64}
//   launcher: local                    # local | torchrun | srun
//   runner: local                      # how sweeps run trials: local | srun (SLURM job steps);
//                                      # default srun when launcher is srun, else local
#pragma once
#include <cstdint>
#include <string>

namespace ulysses::calibrate {

struct HardwareProfile {
  std::string name;
  std::string description;
  std::string device_type = "cpu";  // cpu | cuda
  std::string device_name;
  double device_memory_gib = 0.0;  // per device; for cpu the memory a rank may use
  int64_t nodes = 1;
  int64_t devices_per_node = 1;
  double host_memory_gib = 0.0;   // per node
  int64_t host_cores = 0;         // per node; 0 = not given
  double host_memory_gbps = 0.0;  // per node, peak GB/s; 0 = not given
  double peak_tflops_bf16 = 0.0;  // dense, per device
  double peak_tflops_fp32 = 0.0;
  double intra_node_gbps = 0.0;      // GB/s per device and direction (NVLink; 0 = none)
  double inter_node_gbps = 0.0;      // GB/s per device and direction (InfiniBand/RoCE; 0 = none)
  double host_to_device_gbps = 0.0;  // GB/s per device, pinned (0 on cpu)
  std::string launcher = "local";    // local | torchrun | srun
  std::string runner = "local";      // local | srun: sweeps' trial runner (trial/runner.h)

  // Peak TFLOP/s per device for memory.precision `precision` ("bf16" | "bf16-states" | "fp32");
  // 0 = unknown.
  double peak_tflops(const std::string& precision) const;
  int64_t world_size() const { return nodes * devices_per_node; }
  // host_memory_gbps, or kDefaultHostMemoryGBps when the profile gives none.
  double host_memory_bandwidth_gbps() const;
};

// What the cost model assumes of a node's host memory when its profile gives no
// host_memory_GBps: one socket of DDR5-4800 in 8 channels (8 x 4.8 GT/s x 8 B).
inline constexpr double kDefaultHostMemoryGBps = 307.2;

// Reads and checks a profile. Throws UserError("<path>: <key>: <what is wrong>") for a missing
// or malformed file, an unknown key, a wrong type or value (negative sizes, unknown device type,
// launcher or runner, nodes or devices_per_node < 1).
HardwareProfile load_hardware_profile(const std::string& path);

}  // namespace ulysses::calibrate
