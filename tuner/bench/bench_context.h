// What every ulysses-bench benchmark shares: the run config (model shapes, device, precision),
// the ranks (a world group when started under `ulysses-tune launch --trainer ulysses-bench`, or
// torchrun; a world of 1 otherwise), the benchmark sizes, and a device timer.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "config/options.h"

namespace ulysses::bench {

// Sizes chosen on the command line (ulysses-bench --help).
struct BenchSizes {
  std::vector<int64_t> a2a_bytes;   // per-rank send buffer sizes of the all-to-all
  std::vector<int64_t> seqlens;     // full sequence lengths (sl) for attention
  int64_t tokens = 0;               // tokens per GEMM / MLP call (default sl/sp)
  std::vector<int64_t> copy_bytes;  // host<->device copy sizes (CUDA)
};

struct BenchContext {
  config::RunConfig config;  // validated for the world size
  at::Device device = at::Device(at::kCPU);
  at::ScalarType dtype = at::kFloat;       // memory.precision: fp32 | bf16
  std::unique_ptr<comm::DeviceMesh> mesh;  // world = all ranks (dp 1 x sp world)
  BenchSizes sizes;

  int rank() const { return mesh->rank(); }
  int world_size() const { return mesh->world_size(); }
  comm::Group& world() { return mesh->world(); }
  // The group the all-to-all runs over: this rank's SP group (mesh.sp ranks; with dp > 1 the
  // dp SP groups exchange at the same time, as in training).
  comm::Group& a2a_group() { return mesh->sp(); }

  // The largest value of `local` over the members of `group` (all-reduce MAX), the same on
  // every member. A collective: call on all members.
  double max_over(comm::Group& group, double local);
  // True on every member when `ok` is true on every member of `group`.
  bool all_ok(comm::Group& group, bool ok);
};

// Times one region on the benchmark device: CUDA events on the current stream on CUDA, the
// steady clock on CPU. stop_ms() waits for the device and returns the milliseconds since start().
class DeviceTimer {
 public:
  explicit DeviceTimer(const at::Device& device);
  ~DeviceTimer();
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;
  void start();
  double stop_ms();

 private:
  at::Device device_;
  double start_ms_ = 0.0;
  void* start_event_ = nullptr;  // cudaEvent_t on CUDA
  void* stop_event_ = nullptr;
};

// Waits for the device's pending work (no-op on CPU).
void synchronize(const at::Device& device);

// Registers the benchmarks of each file (bench_comm.cpp, bench_compute.cpp, bench_copy.cpp).
// REQUIRES: ctx outlives benchmark::RunSpecifiedBenchmarks.
void register_comm_benchmarks(BenchContext& ctx);
void register_compute_benchmarks(BenchContext& ctx);
void register_copy_benchmarks(BenchContext& ctx);

// "key:value" name pieces: bench_name("AllToAll", {{"bytes", 1024}}) = "AllToAll/bytes:1024".
std::string bench_name(const std::string& base,
                       const std::vector<std::pair<std::string, std::string>>& args);

}  // namespace ulysses::bench
