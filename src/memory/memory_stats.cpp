// getrusage for host memory; CUDA caching-allocator statistics for device memory.
#include "memory/memory_stats.h"

#include <sys/resource.h>

#include <algorithm>
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
std::optional<int64_t> g_startup_baseline;       // record_startup_baseline (one per process)
std::optional<int64_t> g_startup_address_space;  // the same moment's virtual size (CPU)

// A "<name>: <n> kB" line of /proc/self/status in bytes; 0 when absent or unreadable.
int64_t proc_status_bytes(const std::string& name) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const std::string key = name + ":";
  while (std::getline(status, line)) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size())) * 1024;
  }
  return 0;
}

}  // namespace

void record_startup_baseline(const c10::Device& device) {
  g_startup_baseline = device.is_cuda() ? 0 : peak_host_bytes();
  g_startup_address_space.reset();
  if (!device.is_cuda()) {
    if (const int64_t size = virtual_memory_bytes(); size > 0) g_startup_address_space = size;
  }
}

std::optional<int64_t> startup_baseline_bytes() { return g_startup_baseline; }

int64_t virtual_memory_bytes() { return proc_status_bytes("VmSize"); }

std::optional<int64_t> peak_address_space_above_baseline() {
  if (!g_startup_address_space) return std::nullopt;
  int64_t peak = proc_status_bytes("VmPeak");
  if (peak <= 0) return std::nullopt;
  struct rlimit limit {};
  if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    peak = std::min(peak, static_cast<int64_t>(limit.rlim_cur));
  }
  return std::max<int64_t>(0, peak - *g_startup_address_space);
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
