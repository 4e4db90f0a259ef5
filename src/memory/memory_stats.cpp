// getrusage for host memory; CUDA caching-allocator statistics for device memory.
#include "memory/memory_stats.h"

#include <sys/resource.h>

#include <fstream>
#include <string>

#ifdef ULYSSES_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace ulysses::memory {

int64_t peak_host_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

int64_t virtual_memory_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmSize:", 0) == 0) return std::stoll(line.substr(7)) * 1024;  // "<n> kB"
  }
  return 0;
}

int64_t peak_device_bytes(const c10::Device& device) {
#ifdef ULYSSES_WITH_CUDA
  if (device.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[0].peak;  // StatType::AGGREGATE
  }
#endif
  return 0;
}

void reset_peak_device_bytes(const c10::Device& device) {
#ifdef ULYSSES_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
}

}  // namespace ulysses::memory
