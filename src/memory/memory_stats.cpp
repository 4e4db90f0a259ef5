// getrusage for host memory; CUDA caching-allocator statistics for device memory.
#include "memory/memory_stats.h"

#include <sys/resource.h>

#include <fstream>
#include <string>

#ifdef ULYSSES_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#endif

namespace ulysses::memory {

int64_t peak_host_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

namespace {
std::optional<int64_t> g_startup_baseline;  // record_startup_baseline (one per process)
}  // namespace

void record_startup_baseline(const c10::Device& device) {
  g_startup_baseline = device.is_cuda() ? 0 : peak_host_bytes();
}

std::optional<int64_t> startup_baseline_bytes() { return g_startup_baseline; }

int64_t virtual_memory_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmSize:", 0) == 0) return std::stoll(line.substr(7)) * 1024;  // "<n> kB"
  }
  return 0;
}

DeviceMemory device_memory(const c10::Device& device) {
  DeviceMemory out;
#ifdef ULYSSES_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    out.peak_allocated = stats.allocated_bytes[0].peak;  // StatType::AGGREGATE
    out.peak_reserved = stats.reserved_bytes[0].peak;
    size_t free = 0, total = 0;
    const c10::cuda::CUDAGuard guard(device);
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
      const auto used = static_cast<int64_t>(total - free);
      out.outside_allocator = std::max<int64_t>(0, used - stats.reserved_bytes[0].current);
    }
  }
#endif
  return out;
}

void reset_peak_device_bytes(const c10::Device& device) {
#ifdef ULYSSES_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
}

}  // namespace ulysses::memory
